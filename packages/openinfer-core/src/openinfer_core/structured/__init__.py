"""Structured output: grammars (llguidance) that constrain sampling token by token."""
