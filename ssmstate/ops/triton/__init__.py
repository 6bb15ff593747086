"""Triton kernels on the shared page layout, each with the signature of its twin in :mod:`ssmstate.ops.reference`.

* :mod:`~ssmstate.ops.triton.verify`: verify, the host entry; its kernels in
  :mod:`~ssmstate.ops.triton.verify_tma`, :mod:`~ssmstate.ops.triton.verify_ldg` and (Gluon, Hopper)
  :mod:`~ssmstate.ops.triton.verify_warp`;
* :mod:`~ssmstate.ops.triton.config`: the launch choice (named shapes, ``launch_table.json``, the override context);
* :mod:`~ssmstate.ops.triton.commit`: commit and materialize; :mod:`~ssmstate.ops.triton.conv`: the conv update;
* :mod:`~ssmstate.ops.triton.conv_verify`: a layer's conv update and verify fused in one launch;
* :mod:`~ssmstate.ops.triton.common`: what they share.

Importing this package decorates the kernels: set ``TRITON_INTERPRET=1`` first to run them on CPU tensors.
"""

from ssmstate.ops.triton.commit import replay_commit, replay_materialize
from ssmstate.ops.triton.common import INTERPRETED
from ssmstate.ops.triton.config import DeviceClass, choose_launch, override
from ssmstate.ops.triton.conv import conv_update
from ssmstate.ops.triton.conv_verify import replay_conv_verify
from ssmstate.ops.triton.verify import replay_verify, verify_launches

__all__ = ["DeviceClass", "INTERPRETED", "choose_launch", "conv_update", "override", "replay_commit",
           "replay_conv_verify", "replay_materialize", "replay_verify", "verify_launches"]
