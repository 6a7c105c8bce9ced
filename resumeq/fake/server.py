"""The fake provider as an object (in-process, in a background thread) and as a command."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from types import FrameType, TracebackType
from typing import Any, Self

from resumeq.fake.admin import any_conversation, canonical_of
from resumeq.fake.answer import Canonical, answer_for
from resumeq.fake.chaos import Chaos, ChaosConfig
from resumeq.fake.conversation import conversation_of
from resumeq.fake.engine import Engine, EngineName, TokenizeFormat
from resumeq.fake.faults import Fault
from resumeq.fake.handler import FakeHTTPServer
from resumeq.fake.plan import reasoning_tokens
from resumeq.fake.shape import Shape
from resumeq.fake.state import FakeState

#: What the provider's threads are named after (then the port, then the role).
THREAD_NAME = "resumeq-fake-provider"


class FakeProvider:
    """A loopback HTTP server speaking the OpenAI and Anthropic wires (SPEC §14, §15).

    ``engine`` (``"vllm"``, the default, or ``"llamacpp"``) presets how the OpenAI wire and
    ``/tokenize`` behave; ``prefill_echo``, ``continuous_usage`` and ``tokenize`` override
    the preset (:mod:`resumeq.fake.engine`)."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        completion_tokens: int | None = None,
        token_delay_ms: float = 0.0,
        *,
        engine: EngineName | None = None,
        prefill_echo: bool | None = None,
        continuous_usage: bool | None = None,
        tokenize: TokenizeFormat | None = None,
    ) -> None:
        if completion_tokens is not None and completion_tokens < 1:
            raise ValueError("completion_tokens must be at least 1")
        if token_delay_ms < 0:
            raise ValueError("token_delay_ms must be at least 0")
        self.host = host
        self._requested_port = port
        self.state = FakeState(completion_tokens=completion_tokens, token_delay_ms=token_delay_ms)
        self.configure_engine(
            engine,
            prefill_echo=prefill_echo,
            continuous_usage=continuous_usage,
            tokenize=tokenize,
        )
        self._server: FakeHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> Self:
        if self._server is not None:
            raise RuntimeError("the fake provider is already running")
        self.state.stopped.clear()
        server = FakeHTTPServer((self.host, self._requested_port), self.state, THREAD_NAME)
        thread = threading.Thread(target=server.run, name=server.name, daemon=True)
        server.pacer.start()
        thread.start()
        self._server, self._thread = server, thread
        return self

    def stop(self) -> None:
        """Stop serving; streams in progress (and stalls) end at once, connections close and
        every thread of the provider's has ended on return."""
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        self.state.stopped.set()
        self.state.background.clear()
        server.shutdown()
        server.pacer.stop()
        server.close_connections()
        server.server_close()
        server.join_connections()
        thread.join()
        self._server = self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- addresses -------------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the fake provider is not running")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def openai_base_url(self) -> str:
        """As the OpenAI SDK spells it: ending in ``/v1``."""
        return f"{self.url}/v1"

    @property
    def anthropic_base_url(self) -> str:
        """As the Anthropic SDK spells it: no ``/v1``."""
        return self.url

    # -- control ---------------------------------------------------------------------------

    @property
    def completion_tokens(self) -> int | None:
        return self.state.completion_tokens

    @completion_tokens.setter
    def completion_tokens(self, value: int | None) -> None:
        self.state.completion_tokens = value

    @property
    def token_delay_ms(self) -> float:
        return self.state.token_delay_ms

    @token_delay_ms.setter
    def token_delay_ms(self, value: float) -> None:
        self.state.token_delay_ms = value

    @property
    def engine(self) -> Engine:
        return self.state.engine

    def configure_engine(
        self,
        engine: EngineName | None = None,
        *,
        prefill_echo: bool | None = None,
        continuous_usage: bool | None = None,
        tokenize: TokenizeFormat | None = None,
    ) -> Self:
        """Switch to the preset ``engine`` (None: keep the current behaviour), then apply the
        keys given. :meth:`reset` leaves the engine as it is."""
        self.state.engine = self.state.engine.configure(
            engine, prefill_echo=prefill_echo, continuous_usage=continuous_usage, tokenize=tokenize
        )
        return self

    def add_faults(self, faults: Iterable[Fault | Mapping[str, Any]]) -> list[Fault]:
        """Queue faults for the next generation requests (``POST /_fake/faults``)."""
        return self.state.faults.add(faults)

    def pending_faults(self) -> list[dict[str, Any]]:
        """The queued faults still to apply, each with its ``id`` and ``uses_left`` (``GET
        /_fake/faults``)."""
        return self.state.faults.pending()

    def clear_faults(self) -> int:
        """Drop every queued fault (``DELETE /_fake/faults``); how many there were."""
        return self.state.faults.clear()

    def chaos(
        self,
        probability: float,
        kinds: Sequence[str] = ("disconnect",),
        seed: int = 0,
        **options: Any,
    ) -> Self:
        """Cut each generation request with ``probability``, at a uniformly random token
        (:mod:`resumeq.fake.chaos`); ``probability=0`` turns it off. Options: ``scope``
        (``"global"`` or ``"conversation"``), ``status``, ``retry_after``, ``seconds``."""
        config = ChaosConfig.model_validate(
            {"probability": probability, "kinds": list(kinds), "seed": seed, **options}
        )
        self.state.chaos = Chaos(config) if probability > 0 else None
        return self

    def reset(self) -> None:
        """Clear faults, chaos, journal and prompt cache."""
        self.state.reset()

    def journal(self, settle_s: float = 0.0) -> list[dict[str, Any]]:
        """Every request received and what it got. The server records an exchange's outcome
        just after its last byte, so a client that has read a whole response can look
        before then: ``settle_s`` first waits up to that long for exchanges in progress."""
        deadline = time.monotonic() + settle_s
        while True:
            snapshot = self.state.journal.snapshot()
            busy = any(entry["outcome"] == "in_progress" for entry in snapshot)
            if not busy or time.monotonic() >= deadline:
                return snapshot
            time.sleep(0.01)

    def cpu_seconds(self) -> float:
        """The CPU time (user and system, in seconds) the provider's own threads have used
        since it was made, over every start, not the rest of the process's: take the
        difference of two readings for a span (also ``GET /_fake/stats``)."""
        return self.state.cpu.seconds()

    def canonical_tokens(self, messages: Sequence[Any], system: Any = None) -> list[str]:
        """The canonical completion of a conversation, token by token. ``messages`` as either
        wire spells them (system messages inline, or Anthropic's top-level ``system``). A
        format note makes it the document; a request's tools and format are
        :meth:`canonical`'s."""
        return list(self._target(messages, system).tokens)

    def canonical_text(self, messages: Sequence[Any], system: Any = None) -> str:
        """What a request with no fault and a large ``max_tokens`` returns."""
        return self._target(messages, system).text

    def _target(self, messages: Sequence[Any], system: Any) -> Canonical:
        conversation = any_conversation({"messages": messages, "system": system})
        return answer_for(conversation, Shape(), self.state.completion_tokens).target

    def canonical(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """The uncut answer to ``request`` (its conversation, tools, tool choice and format
        in any wire's form), as ``POST /_fake/canonical`` answers it: ``text``, ``tokens``,
        ``count``, ``tool_calls``, ``document``, ``refusal``, ..."""
        return canonical_of(self.state, request)

    def canonical_reasoning(self, messages: Sequence[Any], system: Any = None) -> list[str]:
        """The reasoning tokens a request without a continuation sends before the text
        (``[fake:reasoning=N]``; none without it)."""
        conversation = conversation_of(messages, system)
        return list(reasoning_tokens(conversation.seed(), conversation.markers().reasoning))


def serve(
    host: str = "127.0.0.1",
    port: int = 8000,
    completion_tokens: int | None = None,
    token_delay_ms: float = 0.0,
    *,
    engine: EngineName | None = None,
    prefill_echo: bool | None = None,
    continuous_usage: bool | None = None,
    tokenize: TokenizeFormat | None = None,
) -> None:
    """Serve in the foreground until SIGINT or SIGTERM (``resumeq fake-provider``)."""
    done = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        done.set()

    previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        fake = FakeProvider(
            host,
            port,
            completion_tokens,
            token_delay_ms,
            engine=engine,
            prefill_echo=prefill_echo,
            continuous_usage=continuous_usage,
            tokenize=tokenize,
        )
        with fake:
            print(
                f"resumeq fake provider on {fake.url} "
                f"(OpenAI base_url {fake.openai_base_url}, Anthropic base_url "
                f"{fake.anthropic_base_url})",
                flush=True,
            )
            while not done.wait(0.5):
                pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
