"""The engine loop: admit requests, prefill, decode every running sequence together, one token per step.

One thread owns the model while serving. New requests join the running batch
between steps (continuous batching), so a long request never holds a short
one. A weight change first drains: admission stops, running sequences finish
on the old weights, the change happens, the version moves, admission resumes.
Every sequence is admitted, prefilled and decoded under one version.

In deterministic mode a sequence's numbers depend on its own prompt and seed
only, never on what else is served: every prompt is prefilled alone and every
sequence decoded alone (`engine.alone`), and sampled alone. The request, chunk
and per-choice types are in `engine.sequences`.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from collections import deque
from collections.abc import AsyncIterator
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from engine import alone, attention
from engine.errors import ContextOverflow, EngineUnavailable, InvalidRequest
from engine.forward import decode_logits, supports_direct
from engine.kv_batch import KV, KVBatch, cache_tensors
from engine.lora import Adapters
from engine.prefix_cache import PrefixCache
from engine.sampling import sample
from engine.sequences import Chunk, Request, Sequence, Submission, by_submission, deliver
from engine.text import TextStream
from schemas.adapters import is_adapter


class Engine:
    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        max_batch: int = 64,
        max_model_len: int | None = None,
        version: int = 0,
        prefix_cache_bytes: int = 512 << 20,
        base: Path | None = None,
        deterministic: bool = False,
    ) -> None:
        self.model = model.eval()
        self.deterministic = deterministic
        self.adapters = Adapters(model, base)  # versions that are low-rank adapters on these weights
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.max_model_len = max_model_len or int(model.config.max_position_embeddings)
        self.max_batch = max_batch
        self.eos_ids = _eos_ids(model, tokenizer)
        self._direct = supports_direct(model)
        if self._direct and model.config._attn_implementation in ("sdpa", "eager"):
            model.set_attn_implementation(attention.NAME)  # same results, no key/value copies when decoding
        self.version = version
        self.busy_s = 0.0  # seconds spent in prefill and decode steps: the device's share of generation
        self._pending: deque[Submission] = deque()
        self._running: list[Sequence] = []
        self._kv = KVBatch()
        self.prefixes = PrefixCache(prefix_cache_bytes)  # the engine thread's; cleared while drained
        self._cond = threading.Condition()
        self._admitting = True
        self._held = False  # paused by a caller (the trainer's hand-over), not by a weight change
        self.asleep = False  # its weights in host memory and its caches dropped (collocated: the trainer's turn)
        self._idle = threading.Event()
        self._stopping = False
        self._update_lock = asyncio.Lock()
        self._rng = random.Random()  # unseeded requests share it
        self._thread = threading.Thread(target=self._serve, name="engine", daemon=True)

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout=30)

    @property
    def paused(self) -> bool:
        return not self._admitting

    # -- requests --------------------------------------------------------------

    def check(self, request: Request) -> None:
        """Refuse what cannot be served, before anything is queued."""
        if not request.prompt_ids:
            raise InvalidRequest("prompt must not be empty", "prompt")
        bad = [t for t in request.prompt_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidRequest(f"token ids out of vocabulary (size {self.vocab_size}): {bad[:5]}", "prompt")
        wanted = len(request.prompt_ids) + request.max_tokens
        if wanted > self.max_model_len:
            raise ContextOverflow(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{wanted} tokens ({len(request.prompt_ids)} in the prompt, {request.max_tokens} in the completion).",
                "max_tokens",
            )

    async def generate(self, request: Request) -> AsyncIterator[Chunk]:
        """Chunks of all n choices as they are produced; each says the weight version that produced it."""
        self.check(request)
        submission = Submission(request=request, queue=asyncio.Queue(), loop=asyncio.get_running_loop())
        with self._cond:
            if self._stopping:
                raise EngineUnavailable("the engine is shutting down")
            self._pending.append(submission)
            self._cond.notify_all()
        finished = 0
        try:
            while finished < request.n:
                item = await submission.queue.get()
                if isinstance(item, BaseException):
                    raise item
                finished += item.finish_reason is not None
                yield item
        finally:
            submission.cancelled = True

    # -- weights -----------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def exclusive(self, new_version: int | None = None) -> AsyncIterator[PreTrainedModel]:
        """Drain, then hand out the model for a weight change; on exit set the version and resume admission."""
        async with self._update_lock:
            with self._cond:
                self._admitting = False
                self._idle.clear()
                self._cond.notify_all()
            await asyncio.to_thread(self._idle.wait)
            self.prefixes.clear()  # caches computed with the old weights
            try:
                yield self.model
            finally:
                with self._cond:
                    if new_version is not None:
                        self.version = new_version
                    self._admitting = not (self._held or self.asleep)
                    self._cond.notify_all()

    async def _drain(self) -> None:
        with self._cond:
            self._admitting = False
            self._idle.clear()
            self._cond.notify_all()
        await asyncio.to_thread(self._idle.wait)

    def _readmit(self) -> None:
        with self._cond:
            self._admitting = not (self._held or self.asleep)
            self._cond.notify_all()

    async def pause(self) -> None:
        """Stop admitting and wait for what runs to finish (vLLM's pause, mode wait); calls queue meanwhile."""
        self._held = True
        await self._drain()

    def resume(self) -> None:
        self._held = False
        self._readmit()

    async def sleep(self) -> None:
        """Give the accelerator to the trainer: drained, caches dropped, weights moved to host memory (on a CPU
        there is nothing to move). Calls queue until `wake`."""
        async with self._update_lock:
            self.asleep = True
            await self._drain()
            self.prefixes.clear()
            if self.device.type != "cpu":
                self.model.to("cpu")
                torch.cuda.empty_cache()

    async def wake(self) -> None:
        async with self._update_lock:
            if self.device.type != "cpu":
                self.model.to(self.device)
            self.asleep = False
            self._readmit()

    async def reset_prefix_cache(self) -> None:
        async with self.exclusive():
            pass  # drained, the cache cleared, admission as it was

    async def load_state_dict(self, state: dict[str, torch.Tensor], version: int) -> None:
        async with self.exclusive(version) as model:
            model.load_state_dict(state, strict=False)

    async def load_checkpoint(self, path: str, version: int) -> None:
        """Whole weights, or an adapter on the base this engine started with (switched in, not merged)."""
        folder = Path(path)
        if is_adapter(folder):
            loaded = await asyncio.to_thread(self.adapters.read, folder, str(self.device))
            async with self.exclusive(version):
                self.adapters.switch(loaded)
            return
        if self.adapters.active is not None:
            raise InvalidRequest(f"checkpoint {path} holds whole weights, but this engine serves adapters on its "
                                 "base: restart it on those weights", "path")
        state = await asyncio.to_thread(_read_safetensors, folder, str(self.device))
        missing = set(self.model.state_dict()) - set(state) - _tied_names(self.model)
        if missing:
            raise InvalidRequest(f"checkpoint {path} lacks {sorted(missing)[:3]}...", "path")
        await self.load_state_dict(state, version)

    # -- the loop (engine thread) ------------------------------------------------

    def _serve(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and not self._running and not (self._pending and self._admitting):
                    self._idle.set()
                    self._cond.wait()
                if self._stopping:
                    break
                admitted = self._admit()
            started = time.perf_counter()
            try:
                with torch.inference_mode():
                    self._prefill(admitted)
                    if self._running:
                        self._decode()
            except Exception as exc:  # a failing step fails its requests, never the engine
                for seq in [*self._running, *(s for s in admitted if s not in self._running)]:
                    seq.submission.put(EngineUnavailable(f"generation failed: {exc!r}"))
                self._running, self._kv = [], KVBatch()
            finally:
                self.busy_s += time.perf_counter() - started
        for seq in self._running:
            seq.submission.put(EngineUnavailable("the engine stopped"))
        for sub in self._pending:
            sub.put(EngineUnavailable("the engine stopped"))

    def _admit(self) -> list[Sequence]:
        admitted: list[Sequence] = []
        while self._admitting and self._pending:
            sub = self._pending[0]
            if sub.cancelled:
                self._pending.popleft()
                continue
            if len(self._running) + len(admitted) + sub.request.n > self.max_batch and (self._running or admitted):
                break
            self._pending.popleft()
            sub.version = self.version
            seed = sub.request.sampling.seed
            for i in range(sub.request.n):
                rng = random.Random(seed + i) if seed is not None else self._rng
                text = TextStream(self.tokenizer, sub.request.stop)
                admitted.append(Sequence(submission=sub, index=i, text=text, rng=rng,
                                          chunk=Chunk(index=i, version=self.version)))
        if admitted:
            self._idle.clear()
        return admitted

    def _prefill(self, admitted: list[Sequence]) -> None:
        """A prompt that starts like a recent one computes only its new tokens; of the others, prompts of equal
        length share one forward pass (no padding needed) and the rest go alone."""
        if self.deterministic:
            for seqs in by_submission(admitted).values():
                self._prefill_alone(seqs)
            return
        by_length: dict[int, list[Sequence]] = {}
        for sub, seqs in by_submission(admitted).items():
            ids = sub.request.prompt_ids
            reused, kv = self.prefixes.longest(ids) if self.prefixes.max_bytes else (0, [])
            if reused:
                self._forward(seqs, reused, kv)
            else:
                by_length.setdefault(len(ids), []).extend(seqs)
        for group in by_length.values():
            self._forward(group, 0, [])

    def _forward(self, group: list[Sequence], reused: int, prefix: KV) -> None:
        """Prefill prompts of one length whose first `reused` ids have the cache `prefix` (all share it)."""
        ids = torch.tensor([s.submission.request.prompt_ids[reused:] for s in group], device=self.device)
        rows = len(group)
        cache = DynamicCache(ddp_cache_data=[(k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1))
                                             for k, v in prefix]) if reused else DynamicCache()
        out = self.model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        kv = cache_tensors(out.past_key_values)
        length = reused + ids.shape[1]
        if self.prefixes.max_bytes:
            for sub, seqs in by_submission(group).items():
                i = group.index(seqs[0])
                self.prefixes.put(sub.request.prompt_ids, [(k, v) if rows == 1 else (k[i:i + 1].clone(),
                                                           v[i:i + 1].clone()) for k, v in kv])
        self._running += group
        self._emit(group, out.logits[:, -1, :])
        alive = set(map(id, self._running))  # a sequence can finish on its first token
        self._kv.add([([(k[i:i + 1], v[i:i + 1]) for k, v in kv], length)
                      for i, s in enumerate(group) if id(s) in alive])

    def _prefill_alone(self, seqs: list[Sequence]) -> None:
        """Deterministic mode: one prompt, its n choices sharing it (`engine.alone`)."""
        ids = seqs[0].submission.request.prompt_ids
        kv, logits = alone.prefill(self.model, ids, self.prefixes.longest(ids) if self.prefixes.max_bytes else
                                   (0, []), self.device)
        if self.prefixes.max_bytes:
            self.prefixes.put(ids, kv)
        self._running += seqs
        for seq in seqs:  # a cache object per choice; a step concatenates into new tensors, the prompt's stay
            seq.cache, seq.length = DynamicCache(ddp_cache_data=list(kv)), len(ids)
            self._emit([seq], logits)

    def _decode_alone(self) -> None:
        """Deterministic mode: each sequence's step is its own forward, over exactly its own positions."""
        for seq in list(self._running):
            assert seq.cache is not None
            logits = alone.decode(self.model, seq.next_token, seq.cache, seq.length, self.device, self._direct)
            seq.length += 1
            self._emit([seq], logits)

    def _decode(self) -> None:
        if self.deterministic:
            self._decode_alone()
            return
        cache, mask, positions = self._kv.step_inputs(self.device)
        tokens = torch.tensor([[seq.next_token] for seq in self._running], device=self.device)
        logits = decode_logits(self.model, tokens, mask, positions, cache, self._direct)
        self._kv.advance(cache)
        before = list(self._running)
        self._emit(before, logits)
        if len(self._running) != len(before):
            keep = set(map(id, self._running))
            self._kv.keep([i for i, seq in enumerate(before) if id(seq) in keep])

    def _emit(self, seqs: list[Sequence], logits: torch.Tensor) -> None:
        """Sample one token per sequence, send it, and retire the sequences that finished."""
        sampled = sample(logits, [s.submission.request.sampling for s in seqs], [s.rng for s in seqs])
        tokens, logprobs = sampled.tokens.tolist(), sampled.logprobs.tolist()
        top_ids, top_lps = sampled.top_ids.tolist(), sampled.top_logprobs.tolist()
        done: set[int] = set()
        outbox: dict[asyncio.AbstractEventLoop, list[tuple[Submission, Chunk]]] = {}
        for row, seq in enumerate(seqs):
            request = seq.submission.request
            token = tokens[row]
            seq.next_token, seq.generated = token, seq.generated + 1
            offset = len(seq.text.text)
            stopped_by_text = seq.text.push(token)
            finish: str | None = None
            stop_reason: str | int | None = None
            if stopped_by_text:
                finish, stop_reason = "stop", seq.text.stop_reason
            elif token in request.stop_token_ids or (token in self.eos_ids and not request.ignore_eos):
                finish, stop_reason = "stop", (token if token in request.stop_token_ids else None)
            elif seq.generated >= request.max_tokens or len(request.prompt_ids) + seq.generated >= self.max_model_len:
                finish = "length"
            if finish is not None:
                seq.text.finish()
            k = request.sampling.top_logprobs
            chunk = seq.chunk
            chunk.token_ids.append(token)
            chunk.logprobs.append(logprobs[row])
            chunk.tops.append(list(zip(top_ids[row][:k], top_lps[row][:k], strict=True)))
            chunk.text_offsets.append(offset)
            if request.stream or finish is not None:
                chunk.text = seq.text.delta(final=finish is not None)
                chunk.finish_reason, chunk.stop_reason = finish, stop_reason
                outbox.setdefault(seq.submission.loop, []).append((seq.submission, chunk))
                seq.chunk = Chunk(index=seq.index, version=chunk.version)
            if finish is not None or seq.submission.cancelled:
                done.add(id(seq))
        for loop, batch in outbox.items():  # one wake-up per event loop and step, not one per token
            loop.call_soon_threadsafe(deliver, batch)
        if done:
            self._running = [s for s in self._running if id(s) not in done]


def _eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> set[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config):
        eos = getattr(source, "eos_token_id", None)
        ids |= set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids


def _tied_names(model: PreTrainedModel) -> set[str]:
    return {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()


def _read_safetensors(path: Path, device: str) -> dict[str, torch.Tensor]:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise InvalidRequest(f"no *.safetensors files in {path}", "path")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(f, device=device))
    return state
