"""EAGLE-3 self-distillation: training prompts, target features, and the training loop."""
