echo "no vLLM installer yet"; exit 1
