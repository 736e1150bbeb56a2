"""The target model on this device: loading (offline GGUF default or any HF causal LM), the forward the engine
drives (transformers' own or the lean one), hidden-state capture, and the calibrated verification cost curve."""
