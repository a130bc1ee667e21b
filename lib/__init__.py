"""The floor on the model and the tokenizer (model.py, tokenization_manager.py, reward_dataset_loader.py,
on core/): what builds, reads and feeds the models. Never imports experiment/ or a script.

  checkpoint      every checkpoint and Hugging Face directory, read and written
  hf_interop      Hugging Face GPT-2 <-> this GPT, without transformers
  corpus          a prepared directory read back; text and token files
  prepare         preparing a corpus, streamed through a pool of tokenizing processes
  hf_corpus       a local Hugging Face dataset as input text
  heldout         windows of a token file: the held-out loss and perplexity; train.py's batches
  reward_head     the reward head's forward, loss and freezing
  reward_samples  the reward dataset's sample plan and generation
  finetune        GRPO's and SPIN's shared layer: state and run bases, save, resume, AdamW flags
  grpo_objective  GRPO's variants built once: the reward (and its shaping) and the loss terms
  rl_data         their prompts: the base model's corpus, checked against its record; windows
  settings        train.py's and the reward model's flags, defined once (the scripts and run_cycles read them)
  rl_settings     GRPO's and SPIN/DDO's flags, the same way
  ensemble        K generators as one (their mean probabilities), and distillation's loss (train_distill.py)
  detector_reward a detector as a reward for other trainers: TRL's reward function, serve_reward.py's scores
"""
