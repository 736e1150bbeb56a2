"""The decoding algorithm, model-agnostic: configs, the token tree, verification rules, the KV cache, policies
(which drafter runs at each step), costs, the probe, and the one engine loop that yields a StepEvent per step."""
