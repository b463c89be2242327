"""Built-in tool-call parsers (`interfaces.parsers.ToolParser`) and what they share."""
