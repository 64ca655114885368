"""Conversation templates: how user turns (and the assistant's answers between them) become the
prompt a model continues.

- A tokenizer with a chat template uses it (``apply_chat_template``).
- Vicuna-family models ship none; they get FastChat's ``vicuna_v1.1``, the template Spec-Bench and
  the Token Recycling paper use: ``{system} USER: {q1} ASSISTANT: {a1}</s>USER: {q2} ASSISTANT:``
  (FastChat's ``ADD_COLON_TWO`` style: a space after a user turn, ``</s>`` after an answer).
- Any other model without one (a base model) continues the plain text.
"""
from __future__ import annotations

VICUNA_SYSTEM = ("A chat between a curious user and an artificial intelligence assistant. "
                 "The assistant gives helpful, detailed, and polite answers to the user's questions.")
CHAT = "chat template (tokenizer)"
VICUNA = "vicuna_v1.1"
PLAIN = "plain text"


def pick_template(tokenizer, model_name: str) -> str:
    """``CHAT``, ``VICUNA`` or ``PLAIN`` for a tokenizer and the model's name or path."""
    if getattr(tokenizer, "chat_template", None):
        return CHAT
    return VICUNA if "vicuna" in model_name.lower() else PLAIN


def vicuna_prompt(questions: list[str], answers: list[str]) -> str:
    """FastChat's ``vicuna_v1.1`` rendering, ready for the next answer."""
    text = VICUNA_SYSTEM + " "
    for n, q in enumerate(questions):
        text += f"USER: {q} ASSISTANT:"
        if n < len(answers):
            text += f" {answers[n]}</s>"
    return text


def plain_prompt(questions: list[str], answers: list[str]) -> str:
    """Turns one after another, each answer on lines of its own."""
    return "".join(q + ("\n" + answers[n] + "\n" if n < len(answers) else "") for n, q in enumerate(questions))


def encode_turns(tokenizer, template: str, questions: list[str], answers: list[str]) -> list[int]:
    """Token ids of ``questions`` with ``answers`` between them (one fewer), through ``template``."""
    if template == CHAT:
        messages = []
        for n, q in enumerate(questions):
            messages.append({"role": "user", "content": q})
            if n < len(answers):
                messages.append({"role": "assistant", "content": answers[n]})
        out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if hasattr(out, "keys"):  # transformers 5 returns a BatchEncoding
            out = out["input_ids"]
        return [int(t) for t in out]
    text = vicuna_prompt(questions, answers) if template == VICUNA else plain_prompt(questions, answers)
    return [int(t) for t in tokenizer(text)["input_ids"]]
