# nanoGPT's CPU command for Tiny Shakespeare, as a preset:
#   python train.py config/train_shakespeare_char.py --device=cpu --compile=False --eval_iters=20
#     --log_interval=1 --block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128
#     --max_iters=2000 --lr_decay_iters=2000 --dropout=0.0
# python train.py --config config/train_shakespeare_char_cpu.py

# the GPU preset's settings ...
data_dir = 'data/shakespeare_char'
eval_interval = 250
gradient_accumulation_steps = 1
learning_rate = 1e-3
min_lr = 1e-4
beta2 = 0.99
warmup_iters = 100

# ... with the CPU command's overrides
out_dir = 'out-shakespeare-char-cpu'
device = 'cpu'
compile = False
eval_iters = 20
log_interval = 1
block_size = 64
batch_size = 12
n_layer = 4
n_head = 4
n_embd = 128
max_iters = 2000
lr_decay_iters = 2000
dropout = 0.0
