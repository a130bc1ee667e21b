"""
Training schedules: early stopping on a metric, and nanoGPT's learning rate (linear warm-up, cosine decay).
"""
import math


class EarlyStopping:
    """Stop when the metric has not improved by at least `min_delta` for `patience` checks.

    `mode='min'` for losses, 'max' for rewards. `patience <= 0` disables stopping.
    """

    def __init__(self, patience=5, min_delta=0.0, mode="min", best=None, bad_checks=0):
        assert mode in ("min", "max")
        self.patience = patience
        self.min_delta = min_delta
        self.mode = mode
        self.best = best
        self.bad_checks = bad_checks

    def improved(self, value):
        if self.best is None or not math.isfinite(self.best):
            return True
        if self.mode == "min":
            return value < self.best - self.min_delta
        return value > self.best + self.min_delta

    def step(self, value):
        """Record `value`; return True if it is a new best (counter reset)."""
        if self.improved(value):
            self.best = value
            self.bad_checks = 0
            return True
        self.bad_checks += 1
        return False

    @property
    def should_stop(self):
        return self.patience > 0 and self.bad_checks >= self.patience

    def state_dict(self):
        return {"best": self.best, "bad_checks": self.bad_checks,
                "patience": self.patience, "min_delta": self.min_delta, "mode": self.mode}

    def load_state_dict(self, d):
        self.best = d.get("best")
        self.bad_checks = int(d.get("bad_checks", 0))


def cosine_lr(it, learning_rate, min_lr, warmup_iters, lr_decay_iters):
    """Linear warmup, then cosine decay to min_lr at lr_decay_iters, then flat."""
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / max(1, lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))
    return min_lr + coeff * (learning_rate - min_lr)
