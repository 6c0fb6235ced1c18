"""transformers state-space and recurrent LMs (Mamba, Mamba-2, RWKV): training and generate()."""
