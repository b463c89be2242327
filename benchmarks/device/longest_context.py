"""The longest context a running server fits, measured by admitting it: reads the served
`max_model_len` from /v1/models (the engine lowers the model's own to what its KV cache holds
when --max-model-len is left out), sends one completion whose prompt is that long less
`--output-len` random token ids, and reports whether it finished, its prompt tokens as the
server counted them, and the seconds it took (the prefill, mostly).

Usage: python longest_context.py [--base-url URL] [--output-len 8] [--json F]"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time

import httpx


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--output-len", type=int, default=8)
    p.add_argument("--vocab", type=int, default=100_000, help="token ids drawn below this")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--prompt-len", type=int,
                   help="send a prompt this long instead (a step-time probe, not the longest)")
    p.add_argument("--json", help="write the result here")
    args = p.parse_args()
    with httpx.Client(base_url=args.base_url, timeout=args.timeout) as client:
        card = client.get("/v1/models").json()["data"][0]
        limit = int(card["max_model_len"])
        prompt_len = args.prompt_len or limit - args.output_len
        rng = random.Random(0)
        prompt = [rng.randrange(10, args.vocab) for _ in range(prompt_len)]
        start = time.perf_counter()
        response = client.post("/v1/completions", json={
            "model": card["id"], "prompt": prompt, "max_tokens": args.output_len,
            "temperature": 0.0, "ignore_eos": True})
        seconds = time.perf_counter() - start
    result: dict[str, object] = {"max_model_len": limit, "prompt_len": prompt_len,
                                 "status": response.status_code, "seconds": round(seconds, 2)}
    if response.status_code == 200:
        usage = response.json()["usage"]
        result |= {"prompt_tokens": usage["prompt_tokens"],
                   "completion_tokens": usage["completion_tokens"]}
    else:
        result["error"] = response.text[:500]
    print(f"longest context: max_model_len {limit}; a prompt of {prompt_len} tokens "
          f"{'admitted and finished' if response.status_code == 200 else 'FAILED'} in "
          f"{seconds:.1f} s" + ("" if response.status_code == 200 else f": {result['error']}"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    sys.exit(0 if response.status_code == 200 else 1)


if __name__ == "__main__":
    main()
