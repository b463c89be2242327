"""DeepSeek-V4's chat format: `encoding` renders a conversation to the prompt text as the
checkpoint's reference encoder does (the line's `chat_encoder`), `tool_parser` reads the DSML
tool calls back out of the output (the `deepseek_v4` tool-call parser); `markup` holds the
format's literal strings and `turns` the conversation rewrites the encoder applies. Thinking
output (`reasoning</think>content` after a prompt ending in `<think>`) is read by core's
`deepseek_r1` reasoning parser."""
