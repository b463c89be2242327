"""Built-in reasoning parsers (`interfaces.parsers.ReasoningParser`)."""
