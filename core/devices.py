"""
Devices and precision: --device and --dtype, autocast, the float16 gradient scaler and the optimizer step
it wraps, and torch.distributed (torchrun) set-up and teardown; every process's random state, gathered.
"""
import contextlib
import os
import re

from core.errors import ProjectError
from core.files import OUTPUT_DIRS


class _Torch:
    """torch, imported on first use: prepare_data.py and the tokenizers (and the pool processes
    prepare_data.py forks) never need it, and importing it costs seconds and about 200 MB each."""

    def __getattr__(self, name):
        import torch
        return getattr(torch, name)


torch = _Torch()


DEVICE_NAME = re.compile(r"cpu|mps|cuda(?::(\d+))?")  # what --device may name ('auto' aside)


def device_available(device):
    m = DEVICE_NAME.fullmatch(device)
    if m is None:  # 'cuda:abc', 'cudax', 'tpu'
        return False
    if device == "cpu":
        return True
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            return False
        return m.group(1) is None or int(m.group(1)) < torch.cuda.device_count()
    return hasattr(torch.backends, "mps") and torch.backends.mps.is_available()  # 'mps'


def device_name(device):
    """The hardware behind a resolved device, for the results' stamp: the GPU's name on CUDA, else the
    CPU's model (from /proc/cpuinfo where there is one) and its core count."""
    if str(device).startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    if device == "mps":
        return "Apple MPS"
    model = None
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    return f"{model or 'CPU'}, {os.cpu_count()} cores"


def resolve_device(device="auto", flag="--device"):
    """'auto' -> cuda, mps or cpu; an explicit but unavailable device is a ProjectError."""
    if device == "auto":
        if torch.cuda.is_available():
            return "cuda"
        if hasattr(torch.backends, "mps") and torch.backends.mps.is_available():
            return "mps"
        return "cpu"
    if DEVICE_NAME.fullmatch(device) is None:
        raise ProjectError(f"{flag} {device} is not a device", f"use {flag} auto, cpu, cuda, cuda:N or mps")
    if not device_available(device):
        raise ProjectError(f"{flag} {device} is not available on this machine",
                           f"use {flag} auto or {flag} cpu")
    return device


def resolve_dtype(dtype, device):
    """'auto' -> bfloat16 on CUDA with bf16 support, else float16 on CUDA, float32 elsewhere."""
    if dtype == "auto":
        if device.startswith("cuda"):
            return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
        return "float32"
    return dtype


AUTOCAST_DEVICES = ("cuda", "cpu")
DTYPES = ("auto", "float32", "bfloat16", "float16")


def add_dtype_arg(parser):
    """Every script's --dtype (resolve_dtype, autocast_context)."""
    parser.add_argument("--dtype", default="auto", choices=DTYPES,
                        help="autocast precision ('auto': bfloat16 on CUDA if supported, else float16; float32 on "
                             "CPU and MPS); an explicit bfloat16 or float16 autocasts on CPU too; float16 trains "
                             "with a gradient scaler")


def autocast_context(device, dtype):
    """Mixed precision: autocast in bfloat16 or float16 on CUDA and on CPU (where only an explicit
    --dtype asks for it: 'auto' is float32 there); a no-op context for float32 or other devices."""
    kind = device.split(":")[0]
    if dtype == "float32" or kind not in AUTOCAST_DEVICES:
        return contextlib.nullcontext()
    ptdtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    return torch.amp.autocast(device_type=kind, dtype=ptdtype)


def synchronize(device):
    """Wait for the work queued on a CUDA device, so a timing means what it says (a no-op elsewhere)."""
    if str(device).startswith("cuda"):
        torch.cuda.synchronize(device)


def needs_grad_scaler(device, dtype):
    """True exactly where float16 autocast runs (autocast_context), whose small gradients underflow
    unless the loss is scaled up first."""
    return dtype == "float16" and device.split(":")[0] in AUTOCAST_DEVICES


def grad_scaler(device, dtype):
    """The gradient scaler of a training loop: enabled where needs_grad_scaler, a disabled one
    (every call a no-op: scale returns the loss, step just steps) elsewhere."""
    kind = device.split(":")[0]
    return torch.amp.GradScaler(kind if kind in AUTOCAST_DEVICES else "cpu", enabled=needs_grad_scaler(device, dtype))


def clip_and_step(scaler, optimizer, params, grad_clip):
    """One optimizer step after backward(scaler.scale(loss)): unscale, clip the gradient norm to
    grad_clip (<= 0: no clipping), step (skipped by the scaler on inf/nan gradients) and update the
    scale. Returns the gradient norm before clipping (a tensor)."""
    scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else float("inf"))
    scaler.step(optimizer)
    scaler.update()
    return norm


def wrap_ddp(module, dist, device):
    """`module` in DistributedDataParallel under torchrun (on this process's GPU, or CPU/gloo),
    else `module` itself. Evaluate through the unwrapped module: rank 0 evaluates alone."""
    if not dist.enabled:
        return module
    from torch.nn.parallel import DistributedDataParallel as DDP
    return DDP(module, device_ids=[dist.local_rank] if str(device).startswith("cuda") else None)


class DistInfo:
    def __init__(self, enabled=False, rank=0, local_rank=0, world_size=1):
        self.enabled = enabled
        self.rank = rank
        self.local_rank = local_rank
        self.world_size = world_size

    @property
    def master(self):
        return self.rank == 0

    def share(self, total, flag):
        """This process's part of a per-step total (`flag` names it in the error): the scripts'
        batch flags are totals, so one command means the same run for any number of processes."""
        if total % self.world_size:
            raise ProjectError(f"{flag} {total} is not divisible by the {self.world_size} processes "
                               f"(it is the total per step)", "use a multiple of the number of processes")
        return total // self.world_size

    def my_slice(self, x):
        """This rank's equal part (along the first dimension) of something every rank drew alike."""
        n = len(x) // self.world_size
        return x[self.rank * n:(self.rank + 1) * n]


def init_distributed(device="auto", backend=None):
    """Initialise torch.distributed when launched by torchrun (RANK set).

    Returns (DistInfo, device). gloo on CPU, nccl on CUDA (unless `backend` names
    one); each rank takes the GPU of its local rank.
    """
    if int(os.environ.get("RANK", -1)) == -1:
        return DistInfo(), resolve_device(device)
    backend_override = None if backend in (None, "auto") else backend
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    world_size = int(os.environ["WORLD_SIZE"])
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        device = f"cuda:{local_rank}"
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = resolve_device(device)
        backend = "gloo"
    torch.distributed.init_process_group(backend=backend_override or backend)
    return DistInfo(True, rank, local_rank, world_size), device


def end_run(dist):
    """A script's last step: leave the process group and release the output directory locks."""
    if dist.enabled and torch.distributed.is_initialized():
        # every rank arrives before any leaves: no rank tears its connections down while a peer
        # (rank 0 writing summaries and plots) still has them open
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    OUTPUT_DIRS.release_all()


def gather_rng_states(dist, device):
    """Every process's torch random state, gathered on rank 0 (None elsewhere)."""
    mine = {"torch": torch.get_rng_state()}
    if device.startswith("cuda"):
        mine["cuda"] = torch.cuda.get_rng_state(device)
    if not dist.enabled:
        return [mine]
    gathered = [None] * dist.world_size if dist.master else None
    torch.distributed.gather_object(mine, gathered, dst=0)
    return gathered


def all_mean(values, dist, device):
    """Average a list of floats over ranks."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.enabled:
        torch.distributed.all_reduce(t)
        t /= dist.world_size
    return t.tolist()
