"""The shared library: errors, command lines, processes, files, devices, schedules, checkpoints, corpora, the held-out loss, Hugging Face
interop, tracking, the reward head, the GRPO, SPIN and DDO objectives, rollout prompts, figures, the fused
vocabulary log-probs. No module here imports experiment/."""
