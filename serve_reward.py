"""
The detector as a reward server for other trainers, over HTTP, in OpenRLHF's remote reward-model protocol
(--remote_rm_url http://HOST:PORT/get_reward):

    python serve_reward.py --ckpt out-reward/reward_ckpt.pt --port 5000
    curl -s localhost:5000/get_reward -H 'Content-Type: application/json' -d '{"query": ["ROMEO:\\nO, she doth"]}'
    {"rewards":[0.61],"truncated":[false]}

POST /get_reward  {"query": [text, ...], "prompts": [...] (optional)} -> {"rewards": [...], "truncated": [...]}:
                  each query scored by lib/detector_reward.py's DetectorReward, as train_grpo.py scores a rollout
                  (--reward p_natural or logit). With prompts (OpenRLHF sends them; a query is its prompt and
                  the response), each query must start with its prompt, whose tokens come first, as GRPO's
                  prompts do. A sequence longer than the detector's context keeps its last tokens: truncated.
GET /health       {"status": "ok", ...};   GET /info   the checkpoint, its sha256, tokenizer, block size, reward.

Requests that arrive together share forwards (--batch_cap, --batch_wait_ms): their texts are grouped by
token length and never padded, so a text's reward is the one it gets alone. A bad request gets a 4xx
naming the problem ({"detail": ...}) and the server goes on. SIGTERM or Ctrl-C: requests in flight
finish, new connections are refused, and the process exits 0.
"""
import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import sys

from core.cli import check_flag_ranges, run_cli
from core.devices import resolve_device
from core.errors import CheckpointError, ProjectError
from lib.detector_reward import REWARDS, DetectorReward, TextError


def get_args(argv=None):
    p = argparse.ArgumentParser(description="Serve a detector checkpoint as a reward over HTTP (OpenRLHF's "
                                            "remote reward-model protocol: POST /get_reward).")
    p.add_argument("--ckpt", required=True, help="detector checkpoint of train_reward_model.py (its reward_ckpt.pt)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=5000, help="port to listen on (0: a free one, printed when ready)")
    p.add_argument("--reward", choices=REWARDS, default="p_natural",
                   help="p_natural: P(natural) in [0, 1]; logit: the log-ratio, per-position detectors only")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps")
    p.add_argument("--meta_path", default=None, help="a char detector's meta.pkl, if the one it records is elsewhere")
    p.add_argument("--max_batch", type=int, default=1024, help="most texts in one request (more: 413)")
    p.add_argument("--max_chars", type=int, default=100_000, help="most characters in one text (more: 413)")
    p.add_argument("--batch_cap", type=int, default=64, help="most texts scored together, from concurrent requests")
    p.add_argument("--batch_wait_ms", type=float, default=5.0,
                   help="how long a batch waits for more requests after its first (0: no wait)")
    args = p.parse_args(argv)
    check_flag_ranges(args, "serve_reward.py", [
        ("port", 0 <= args.port <= 65535, "in 0..65535 (0: a free port)"),
        ("max_batch", args.max_batch >= 1, ">= 1"), ("max_chars", args.max_chars >= 1, ">= 1"),
        ("batch_cap", args.batch_cap >= 1, ">= 1"),
        ("batch_wait_ms", 0 <= args.batch_wait_ms < 60_000, "in [0, 60000)")])
    return args


# ----------------------------------------------------------------------------- requests

class BadRequest(Exception):
    """A request the server refuses: its HTTP status (4xx) and a message naming the problem and the fix."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status, self.message = status, message


def check_texts(items, field, args):
    """A list of 1..--max_batch strings of at most --max_chars characters each, or a BadRequest."""
    if not isinstance(items, list):
        raise BadRequest(422, f'"{field}" must be a list of strings, got {type(items).__name__}')
    if not items:
        raise BadRequest(422, f'"{field}" is an empty list: send at least one text')
    if len(items) > args.max_batch:
        raise BadRequest(413, f'"{field}" has {len(items)} texts, more than --max_batch {args.max_batch}: '
                              f'split the request')
    for i, t in enumerate(items):
        if not isinstance(t, str):
            raise BadRequest(422, f'"{field}"[{i}] is {type(t).__name__}, not a string')
        if len(t) > args.max_chars:
            raise BadRequest(413, f'"{field}"[{i}] has {len(t)} characters, more than --max_chars {args.max_chars}: '
                                  f'shorten it, or restart the server with a larger --max_chars')


def parse_body(body, args):
    """(texts, prompts or None) of a /get_reward body: with prompts, each text is its query after the prompt."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(400, f'the body is not JSON ({e}): send {{"query": [text, ...]}}') from None
    if not isinstance(data, dict) or "query" not in data:
        raise BadRequest(422, 'the body has no "query": send {"query": [text, ...]}')
    queries, prompts = data["query"], data.get("prompts")
    check_texts(queries, "query", args)
    if prompts is None:
        return queries, None
    check_texts(prompts, "prompts", args)
    if len(prompts) != len(queries):
        raise BadRequest(422, f'"prompts" has {len(prompts)} texts for {len(queries)} queries: send one per query')
    for i, (q, pr) in enumerate(zip(queries, prompts)):
        if not q.startswith(pr):
            raise BadRequest(422, f'"query"[{i}] does not start with "prompts"[{i}]: a query is its prompt and the '
                                  f'response; or leave "prompts" out to score each query whole')
    return [q[len(pr):] for q, pr in zip(queries, prompts)], prompts


class Batcher:
    """The sequences of requests that arrive together, scored in shared forwards: collected for up to
    --batch_wait_ms after the first arrives or until --batch_cap texts wait, then each request gets its own
    rewards. One batch runs at a time, in a worker thread, so the event loop goes on taking requests."""

    def __init__(self, scorer, cap, wait_s):
        self.scorer, self.cap, self.wait_s = scorer, cap, wait_s
        self.pending = []  # (sequences, future) of each waiting request, in arrival order
        self.arrived = asyncio.Event()
        self.batches = self.texts = 0

    async def score(self, seqs):
        """A request's rewards, once its batch has run."""
        future = asyncio.get_running_loop().create_future()
        self.pending.append((seqs, future))
        self.arrived.set()
        return await future

    def waiting(self):
        return sum(len(seqs) for seqs, _ in self.pending)

    async def run(self):
        """Forever: wait for a request, gather more until the cap or the wait, score what was gathered."""
        loop = asyncio.get_running_loop()
        while True:
            await self.arrived.wait()
            deadline = loop.time() + self.wait_s
            while self.waiting() < self.cap and loop.time() < deadline:
                self.arrived.clear()  # an Event (not a Queue.get) under wait_for: a timeout loses no request
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.arrived.wait(), deadline - loop.time())
            batch, n = [], 0
            while self.pending and (not batch or n + len(self.pending[0][0]) <= self.cap):
                batch.append(self.pending.pop(0))
                n += len(batch[-1][0])
            if not self.pending:
                self.arrived.clear()
            await self.run_batch(batch)

    async def run_batch(self, batch):
        seqs = [s for item, _ in batch for s in item]
        try:
            rewards = await asyncio.to_thread(self.scorer.score_sequences, seqs)
        except Exception as e:  # a bug: each request of the batch answers 500 with it
            for _, future in batch:
                if not future.done():
                    future.set_exception(e)
            return
        self.batches, self.texts = self.batches + 1, self.texts + len(seqs)
        k = 0
        for item, future in batch:
            if not future.done():  # done: its client left, and the request was cancelled
                future.set_result(rewards[k:k + len(item)])
            k += len(item)


# ----------------------------------------------------------------------------- the app

def make_app(scorer, args):
    """The FastAPI app: /get_reward, /health, /info around a DetectorReward and a Batcher."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse
    state = {}

    @contextlib.asynccontextmanager
    async def lifespan(app):
        state["batcher"] = Batcher(scorer, args.batch_cap, args.batch_wait_ms / 1000)
        task = asyncio.create_task(state["batcher"].run())
        yield  # uvicorn's shutdown lets requests in flight finish before it gets here
        task.cancel()

    app = FastAPI(title="adversarial-gpt detector reward", lifespan=lifespan)

    @app.post("/get_reward")
    async def get_reward(request: Request):
        try:
            texts, prompts = parse_body(await request.body(), args)
            seqs = await asyncio.to_thread(scorer.encode, texts, prompts, ('"query"', '"prompts"'))
        except BadRequest as e:
            return JSONResponse({"detail": e.message}, status_code=e.status)
        except TextError as e:
            return JSONResponse({"detail": f"{e.message}: {e.suggestion}"}, status_code=422)
        rewards = await state["batcher"].score(seqs)
        return {"rewards": rewards, "truncated": [s.truncated for s in seqs]}

    @app.get("/health")
    async def health():
        b = state["batcher"]
        return {"status": "ok", "batches": b.batches, "texts": b.texts, "waiting": b.waiting()}

    @app.get("/info")
    async def info():
        return {**scorer.info(), "max_batch": args.max_batch, "max_chars": args.max_chars,
                "batch_cap": args.batch_cap, "batch_wait_ms": args.batch_wait_ms}

    return app


def load_scorer(args):
    """The DetectorReward of --ckpt; a file that is not a detector names the flag and the fix."""
    device = resolve_device(args.device)
    print(f"loading {args.ckpt} on {device} ...", flush=True)
    try:
        return DetectorReward(args.ckpt, args.reward, device, args.batch_cap, args.meta_path)
    except CheckpointError as e:
        raise CheckpointError(f"--ckpt: {e.message}", e.suggestion) from None


def listening_socket(host, port):
    """A socket bound to host:port (port 0: a free one), or a ProjectError naming --host / --port."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as e:
        raise ProjectError(f"cannot listen on --host {host} --port {port}: {e.strerror or e}",
                           "choose another --port (0: a free one), or a --host of this machine") from None
    return sock


async def serve(app, args, scorer, sock):
    """Run uvicorn on the bound socket until SIGTERM or Ctrl-C, then shut down gracefully."""
    import uvicorn
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="info", access_log=False))
    # uvicorn handles the signals while it serves and raises them again when it is done: these handlers
    # take that second one, so a graceful stop ends the process with 0 (and one before serve starts stops it)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: setattr(server, "should_exit", True))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started and not task.done():
        await asyncio.sleep(0.02)
    if server.started:
        port = sock.getsockname()[1]
        print(f"ready: {scorer.reward} of {args.ckpt} ({scorer.tokenizer.info}, block {scorer.block_size}) on "
              f"http://{args.host}:{port} (POST /get_reward, GET /health, GET /info)", flush=True)
    await task


def main(argv=None):
    args = get_args(argv)
    try:  # before the model loads: a missing package fails at once
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise ProjectError(f"serve_reward.py needs the package {e.name}", "pip install fastapi uvicorn") from None
    if not os.path.exists(args.ckpt):
        raise CheckpointError(f"--ckpt {args.ckpt}: no such file",
                              "pass the reward_ckpt.pt that train_reward_model.py wrote in its --out_dir")
    sock = listening_socket(args.host, args.port)  # a port in use fails before the model loads
    try:
        scorer = load_scorer(args)
    except ProjectError:
        sock.close()
        raise
    asyncio.run(serve(make_app(scorer, args), args, scorer, sock))
    print("stopped", file=sys.stderr, flush=True)


if __name__ == "__main__":
    run_cli(main)
