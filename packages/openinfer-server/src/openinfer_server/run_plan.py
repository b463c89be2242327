"""From a request body to its engine requests: the endpoint decides a `RunPlan` once, before the
prompts are known; `build_runs` turns it and the prompts into one `ChoiceRun` per choice."""

from __future__ import annotations

from dataclasses import dataclass, replace

from openinfer_core.params import SamplingParams
from openinfer_core.request import GenerateRequest
from openinfer_server.choice import ChoiceRun
from openinfer_server.prompts import MaxTokens, Prompt
from openinfer_server.state import ServerState


@dataclass(frozen=True, slots=True)
class RunPlan:
    """What a request asks of the engine, beyond its prompts.

    `sampling` holds every sampling field but max_tokens and seed, which each run gets its
    own of: max_tokens from `max_tokens.for_prompt`, seed + i for choice i of a seeded request
    (so the choices differ). `sampling.max_tokens` is `max_tokens.ceiling`, which it was
    checked against. `echo`: each choice's text opens with its prompt (completions).
    `prompt_scores`: choices report vLLM's prompt_logprobs; with `scores_once`, only the first
    choice of a prompt asks for them (a response that reports them once need not have the
    prompt scored n times). Effects: none; `build_runs` submits nothing either."""

    sampling: SamplingParams
    max_tokens: MaxTokens
    n: int
    priority: int = 0
    echo: bool = False
    prompt_scores: bool = False
    scores_once: bool = False

    @property
    def echo_logprobs(self) -> bool:
        """Echoed with logprobs: the prompt's tokens open each choice's logprobs."""
        return self.echo and self.sampling.logprobs is not None

    def scores(self, choice: int) -> bool:
        """Whether choice `choice` of a prompt reports vLLM's prompt_logprobs."""
        return self.prompt_scores and not (self.scores_once and choice > 0)

    def params(self, choice: int, max_tokens: int) -> SamplingParams:
        """The sampling params of choice `choice` of a prompt that may generate `max_tokens`:
        its own seed, and no prompt logprobs when the request reports vLLM's prompt_logprobs
        but this choice does not."""
        base = self.sampling
        seed = None if base.seed is None else _wrap_seed(base.seed + choice)
        unscored = self.prompt_scores and not self.scores(choice)
        prompt_logprobs = None if unscored else base.prompt_logprobs
        return replace(base, max_tokens=max_tokens, seed=seed, prompt_logprobs=prompt_logprobs)


def _wrap_seed(seed: int) -> int:
    """A seed within SamplingParams' range: the sampler reads seeds modulo 2**64, so the
    seed of a later choice wraps as it would there."""
    return seed - 2**64 if seed >= 2**64 else seed


def build_runs(state: ServerState, request_id: str, prompts: list[Prompt],
               plan: RunPlan, echoes: list[str] | None = None) -> list[ChoiceRun]:
    """`plan.n` engine requests per prompt, prompt-major; with `plan.echo`, each choice opens
    with its prompt's text from `echoes` (`echo_texts`). Nothing is submitted yet."""
    runs: list[ChoiceRun] = []
    for p, prompt in enumerate(prompts):
        max_tokens = plan.max_tokens.for_prompt(len(prompt.token_ids), state.max_model_len)
        prefix = echoes[p] if plan.echo and echoes is not None else ""
        for i in range(plan.n):
            index = len(runs)
            engine_request = GenerateRequest(f"{request_id}-{index}", tuple(prompt.token_ids),
                                             plan.params(i, max_tokens),
                                             priority=plan.priority)
            runs.append(ChoiceRun(state.engine, engine_request, index, state.tokenizer,
                                  state.metrics, prefix=prefix,
                                  echo_logprobs=plan.echo_logprobs,
                                  prompt_scores=plan.scores(i),
                                  score_only=plan.max_tokens.score_only))
    return runs


def echo_texts(prompts: list[Prompt], state: ServerState, plan: RunPlan) -> list[str]:
    """Each prompt's text as echoed: as sent, or decoded when the client sent token ids (on a
    worker thread: a prompt may be long)."""
    skip = plan.sampling.skip_special_tokens
    return [p.text if p.text is not None
            else state.tokenizer.decode(p.token_ids, skip_special_tokens=skip) for p in prompts]
