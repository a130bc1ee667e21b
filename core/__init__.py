"""The ground floor: the library every script and module stands on, importing no project module outside
core/: errors, command lines, processes and signals, files, devices and precision, schedules, the fused
vocabulary log-probs, sampling, the GRPO, SPIN and DDO objectives, tracking and figures.

  errors    ProjectError and its kinds            cli       run_cli, flag checks, str2bool, progress bars
  process   signals, parent death, peak memory    files     atomic outputs, hashes, directory locks, JSONL
  devices   device, dtype, autocast, scaler, DDP  schedule  early stopping, cosine LR
  logprobs  log-probs without the whole logits    sampling  the next token by inverse CDF on given noise
  objectives  the RL objectives, degeneracy mask  tracking  TensorBoard, Weights & Biases
  plots     the trainers' PNG figures              training  a trainer's start and end (open_run, finish)
"""
