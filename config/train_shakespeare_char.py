# Tiny Shakespeare, character level: nanoGPT's GPU preset (a ~10M-parameter baby GPT).
# python train.py --config config/train_shakespeare_char.py
# Early stopping keeps the CLI defaults (patience 5, min_delta 0.001): this model overfits after
# a few thousand steps, and ckpt.pt holds the best val loss either way.

out_dir = 'out-shakespeare-char'
data_dir = 'data/shakespeare_char'
eval_interval = 250  # evaluate often: the model overfits
eval_iters = 200
log_interval = 10

gradient_accumulation_steps = 1
batch_size = 64
block_size = 256  # context of up to 256 characters

n_layer = 6
n_head = 6
n_embd = 384
dropout = 0.2

learning_rate = 1e-3  # small networks can take a larger learning rate
max_iters = 5000
lr_decay_iters = 5000  # usually equal to max_iters
min_lr = 1e-4  # learning_rate / 10
beta2 = 0.99  # a bit larger: few tokens per iteration
warmup_iters = 100
