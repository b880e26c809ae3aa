"""lite-verl: RL post-training (GRPO, PPO and kin) of Hugging Face causal LMs on one workstation or a laptop.

`import lite_verl` is cheap: it imports no torch, vLLM, DeepSpeed, bitsandbytes or AWQ. Entry points:
the CLI (`lite-verl --help`), `lite_verl.loop.run_training`, `lite_verl.algos` (the pure maths).
"""

__version__ = "0.1.0"
