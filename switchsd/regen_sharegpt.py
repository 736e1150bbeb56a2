"""`python -m switchsd.regen_sharegpt`: the target answers ShareGPT prompts for EAGLE-3 training (a resumable
background job; see switchsd.training.regen_job)."""
from .training.regen_job import main

if __name__ == "__main__":
    main()
