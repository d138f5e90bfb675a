"""`goodspeed` console script: `goodspeed generate ...` (offline) and `goodspeed serve ...` (HTTP)."""

from __future__ import annotations

import argparse
import logging
import sys

from engine.arg_utils import add_engine_arguments, config_from_args


def _add_generate(subparsers) -> None:
    parser = subparsers.add_parser("generate", help="generate text offline, streaming to stdout")
    add_engine_arguments(parser)
    parser.add_argument("--prompt", required=True, help="prompt text")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--sampling-seed", type=int, default=None, help="per-request sampling seed")
    parser.add_argument(
        "--chat", action="store_true", help="wrap the prompt in the model's chat template"
    )
    parser.set_defaults(func=run_generate)


def run_generate(args: argparse.Namespace) -> int:
    from engine.front.llm import LLM
    from engine.sampling_params import SamplingParams

    try:
        params = SamplingParams(
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            seed=args.sampling_seed,
        )
        llm = LLM(config=config_from_args(args))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    def stream(output) -> None:
        sys.stdout.write(output.new_text)
        sys.stdout.flush()

    prompt = args.prompt
    if args.chat:
        prompt = llm.tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}])
    [result] = llm.generate(prompt, params, use_tqdm=False, on_output=stream)
    sys.stdout.write("\n")
    print(
        f"[{result.num_output_tokens} tokens, finish_reason={result.finish_reason}]",
        file=sys.stderr,
    )
    return 0


def _add_serve(subparsers) -> None:
    from server.cli import add_serve_arguments, run_serve

    parser = subparsers.add_parser("serve", help="run the OpenAI-compatible HTTP server")
    add_serve_arguments(parser)
    parser.set_defaults(func=run_serve)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    parser = argparse.ArgumentParser(
        prog="goodspeed", description="goodspeed: LLM inference with goodput-driven speculation"
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    _add_generate(subparsers)
    _add_serve(subparsers)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
