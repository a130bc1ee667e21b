# A quick look on a laptop CPU (about 2 minutes): a 2-layer, 64-wide character model on
# Tiny Shakespeare. It learns words and the play layout, not much more.
# python train.py --config config/train_shakespeare_char_tiny.py

out_dir = 'out-shakespeare-char-tiny'
data_dir = 'data/shakespeare_char'
device = 'cpu'
compile = False
eval_interval = 100
eval_iters = 20
log_interval = 10

batch_size = 16
block_size = 64
n_layer = 2
n_head = 2
n_embd = 64
dropout = 0.0

learning_rate = 2e-3
max_iters = 600
lr_decay_iters = 600
min_lr = 2e-4
beta2 = 0.99
warmup_iters = 50
