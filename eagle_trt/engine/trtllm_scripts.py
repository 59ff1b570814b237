"""serve.sh and bench.sh of a trtllm bundle: bash that works from any working directory.

Each script finds its own dir (`here`), so the bundle can be moved and run from anywhere, and hands
TensorRT-LLM absolute paths only:

- the YAML names the draft `./draft` (relative to the bundle, so two builds of the same inputs stay
  byte-identical); at launch the script writes a copy naming `$here/draft` into a private temp dir;
- trtllm-serve serves a local model under its directory's name, so the script links `$here/target`
  as `<temp>/<name>` and the model is served under the config's `name`;
- serve.sh listens on 127.0.0.1 unless `--host` (or HOST) says otherwise.

    >>> "trtllm-serve" in serve_script("tiny", "# header\\n")
    True
"""

from __future__ import annotations

import shlex

OPTIONS_NAME = "extra_llm_api_options.yaml"

_PRELUDE = r"""set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"
run="$(mktemp -d "${TMPDIR:-/tmp}/eagle-trt.XXXXXX")"
trap 'rm -rf "$run"' EXIT
# The YAML names the draft relative to this dir; TensorRT-LLM gets a copy naming it absolutely
# (a JSON string, which YAML reads as is).
draft="$here/draft"
draft="${draft//\\/\\\\}"
draft="${draft//\"/\\\"}"
options="$(<"$here/@OPTIONS@")"
options="${options//"speculative_model: ./draft"/"speculative_model: \"$draft\""}"
printf '%s\n' "$options" >"$run/@OPTIONS@"
# The tool runs as a child that SIGTERM / SIGINT sent to this script reach (a container's stop signal);
# the EXIT trap removes the temp dir once it has finished.
launch() {
    "$@" &
    local child=$! status=0
    trap 'kill -TERM "$child" 2>/dev/null || true' TERM INT
    wait "$child" || status=$?
    if ((status > 128)); then  # a trapped signal ended the wait: wait for the tool's own exit status
        status=0
        wait "$child" || status=$?
    fi
    return "$status"
}
"""

_SERVE = r"""# OpenAI-compatible server for this bundle, from any directory:
#   ./serve.sh [--host ADDR] [--port N] [more trtllm-serve options]
# Listens on 127.0.0.1:8000 unless --host/--port (or HOST/PORT) say otherwise: --host 0.0.0.0 opens it
# to the network. The model is served as @NAME@.
@PRELUDE@host="${HOST:-127.0.0.1}"
port="${PORT:-8000}"
args=()
while (($#)); do
    case "$1" in
        --host) host="${2:?--host needs an address}"; shift 2 ;;
        --host=*) host="${1#*=}"; shift ;;
        --port) port="${2:?--port needs a number}"; shift 2 ;;
        --port=*) port="${1#*=}"; shift ;;
        *) args+=("$1"); shift ;;
    esac
done
# trtllm-serve names a local model after its directory: this link gives it the engine's name.
ln -s "$here/target" "$run/"@NAME@
launch trtllm-serve "$run/"@NAME@ --tokenizer "$here/tokenizer" --backend pytorch \
    --host "$host" --port "$port" --extra_llm_api_options "$run/@OPTIONS@" "${args[@]}"
"""

_BENCH = r"""# Throughput benchmark, from any directory:
#   ./bench.sh DATASET.jsonl [more trtllm-bench throughput options]
# (make a dataset with TensorRT-LLM's benchmarks/cpp/prepare_dataset.py).
@PRELUDE@dataset="${1:?usage: bench.sh DATASET.jsonl [trtllm-bench throughput options]}"
shift
launch trtllm-bench --model @NAME@ --model_path "$here/target" throughput --backend pytorch \
    --dataset "$dataset" --extra_llm_api_options "$run/@OPTIONS@" "$@"
"""


def _fill(template: str, name: str) -> str:
    body = template.replace("@PRELUDE@", _PRELUDE)
    return body.replace("@OPTIONS@", OPTIONS_NAME).replace("@NAME@", shlex.quote(name))


def serve_script(name: str, header: str) -> str:
    return "#!/usr/bin/env bash\n" + header + _fill(_SERVE, name)


def bench_script(name: str, header: str) -> str:
    return "#!/usr/bin/env bash\n" + header + _fill(_BENCH, name)
