"""Session 19: what the Triton driver reports for the card's DRAM bandwidth and the launch verify_config picks at
batch 64 / 128 / 256 (Nemotron-H, T=4, W=16), printed on the device."""
import torch
import triton

from ssmstate.kernels import triton_replay as trk

d = torch.device("cuda")
print(torch.cuda.get_device_name(d), torch.__version__, triton.__version__)
props = triton.runtime.driver.active.utils.get_device_properties(0)
print({k: props[k] for k in ("mem_clock_rate", "mem_bus_width", "multiprocessor_count")})
print("dram GB/s per SM:", trk._dram_gbps_per_sm(d))
for rows in (64, 128, 256):
    print(rows, trk.verify_config(rows, 128, 64, 128, 20, 4, d, G=8))
