"""The engine's own request/response types: plain data, no llama_cpp."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from homespec.vocab import Drafter, DrafterOrNone, RunMode

Role = Literal["system", "user", "assistant"]
# What `ask --stop ''` and the API's "stop": [""] are refused with (an unset shell variable, a
# client's blank field): an empty stop string would end every answer at once.
EMPTY_STOP = "a stop string is empty (it would end every answer at once): leave it out"


@dataclass(frozen=True)
class Message:
    role: str
    content: str


@dataclass(frozen=True)
class ChatFormat:
    """How a chat becomes a prompt beyond its messages (the fields llama-server and vLLM take).

    `continue_last`: the last message is the assistant's answer begun (a prefill): the prompt
    is the chat before it, opened for the assistant, then that text, and the model goes on
    from there. `generation_prompt`: end with the template's opening of the assistant's turn
    (off: the model writes the next turn's header itself). `variables`: extra values the chat
    template reads (`enable_thinking`), as JSON values.
    """

    continue_last: bool = False
    generation_prompt: bool = True
    variables: Mapping[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        """What the request asked of the rendering, for its prompt_format ("" for nothing)."""
        said = []
        if self.continue_last:
            said.append("continuing the assistant's last message")
        elif not self.generation_prompt:
            said.append("no generation prompt")
        if self.variables:
            said.append("template variables " + ", ".join(sorted(self.variables)))
        return "; ".join(said)


PLAIN_CHAT = ChatFormat()


@dataclass(frozen=True)
class GenerationRequest:
    """One generation. None means "use the pair's or the task's default"."""

    messages: list[Message] | None = None
    prompt: str | None = None  # raw completion prompt (no chat template)
    chat: ChatFormat = PLAIN_CHAT  # how `messages` are rendered (continue, template variables)
    max_tokens: int = 256
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    task: str | None = None
    speculative: bool | None = None  # None = auto (the policy decides), True = force, False = off
    drafter: Drafter | None = None
    draft_tokens: int | None = None
    # Add this prompt and answer to the pair's n-gram memory (the bench turns it off for all
    # but one run of a prompt, so no mode drafts from another mode's answer to it).
    remember: bool = True
    # Teach the governor from this request: how often its drafts were kept, how long its answer
    # ran, what the draft model's catch-ups cost and how much of it lookup committed (the bench
    # turns it off but for `auto`'s measured runs, so auto is measured on what it learned by
    # itself, as a server would be, not on what forced modes or warm-ups of the same prompts
    # showed it first). Costs are measured either way.
    learn: bool = True
    # The client's guess at the answer (OpenAI's `prediction`): n-gram lookup drafts from it
    # (engine/prediction.py); the answer is the target's whatever it says.
    prediction: str | None = None


@dataclass(frozen=True)
class Decision:
    """What the policy chose for one request, and why (never silent)."""

    mode: RunMode
    drafter: DrafterOrNone
    draft_tokens: int
    reason: str
    use_model: bool = True  # the governor may pick the draft model (else n-gram or nothing)


@dataclass
class GenerationStats:
    mode: RunMode
    reason: str
    drafter: DrafterOrNone
    prompt_tokens: int = 0
    cached_tokens: int = 0  # of the prompt's, those the target's cache held (not evaluated)
    completion_tokens: int = 0
    proposed_tokens: int = 0
    accepted_tokens: int = 0
    verify_steps: int = 0  # target decode calls after the prompt
    draft_steps: int = 0  # of those, the ones that carried at least one draft token
    ttft_ms: float = 0.0
    e2e_ms: float = 0.0
    # In the daemon, how long the request waited before its engine started it (behind other
    # requests of its pair, and counting its prompt); 0 in-process. ttft_ms and e2e_ms include
    # it, as the client waited it; tokens_per_s does not, being the pair's speed.
    queue_ms: float = 0.0
    finish_reason: str = "length"
    context_full: bool = False  # "length" because the context was full, before max_tokens
    prompt_format: str = "chat template"  # or a plain transcript for base models, or raw
    seed: int | None = None  # what a sampled answer drew with (None: greedy); sampling.py
    # accepted_per_position[i] counts steps whose draft token i (0-based) was accepted.
    accepted_per_position: list[int] = field(default_factory=list)
    threads: int = 0  # llama.cpp CPU threads at the end (0: not adapted, e.g. the fake target)
    threads_reason: str = ""  # why fewer than the pair's threads (empty: all of them)
    prediction_tokens: int = 0  # the request's prediction, tokenized (0: none)
    accepted_prediction_tokens: int = 0  # of those, drafted and kept in the answer

    @property
    def accept_rate(self) -> float | None:
        return self.accepted_tokens / self.proposed_tokens if self.proposed_tokens else None

    @property
    def tokens_per_s(self) -> float:
        ms = self.e2e_ms - self.queue_ms
        return self.completion_tokens / (ms / 1000.0) if ms > 0 else 0.0

    @property
    def mean_accepted_length(self) -> float | None:
        """Accepted drafts per verify step that carried drafts (vLLM's 'mean acceptance length')."""
        return self.accepted_tokens / self.draft_steps if self.draft_steps else None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["accept_rate"] = None if self.accept_rate is None else round(self.accept_rate, 4)
        d["tokens_per_s"] = round(self.tokens_per_s, 2)
        d["mean_accepted_length"] = (
            None if self.mean_accepted_length is None else round(self.mean_accepted_length, 3)
        )
        d["ttft_ms"] = round(self.ttft_ms, 1)
        d["e2e_ms"] = round(self.e2e_ms, 1)
        d["queue_ms"] = round(self.queue_ms, 1)
        return d


@dataclass(frozen=True)
class Chunk:
    """A piece of streamed text; `drafted` when it came from an accepted draft token."""

    text: str
    drafted: bool
