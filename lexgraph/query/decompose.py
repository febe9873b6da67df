"""The agentic route's decomposition by the LLM: a question into 2–4 retrievable sub-questions.
Without an LLM the engine splits at clauses instead (engine.clause_steps)."""
from __future__ import annotations

from typing import Callable


DECOMPOSE_PROMPT = """\
Split the user's question into the 2 to 4 simpler questions that must be answered, in order, to answer \
it. Each sub-question must make sense on its own (repeat names instead of pronouns). If the question is \
already simple, return it alone."""


def llm_decomposer(llm) -> Callable[[str], list[str]]:
    from pydantic import BaseModel, Field

    class Steps(BaseModel):
        sub_questions: list[str] = Field(default_factory=list, description="2 to 4 self-contained questions")

    def decompose(question: str) -> list[str]:
        """Raises LLMFailure when the call fails after the client's retries: the engine retries the step."""
        steps = llm.call([{"role": "system", "content": DECOMPOSE_PROMPT},
                          {"role": "user", "content": question}], Steps).sub_questions
        return [s.strip() for s in steps if s.strip()][:4]

    return decompose
