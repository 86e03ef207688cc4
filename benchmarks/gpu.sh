#!/usr/bin/env bash
# The GPU benchmark: one JSON line per configuration, under 8 minutes on one GPU.
#
#   pip install -e '.[gpu]' && bash benchmarks/gpu.sh | tee gpu.jsonl
#
# From a fresh checkout: the environment (one line), the attention kernels'
# numbers against float32 softmax attention, global and local (ModernBERT's
# window) (benchmarks/attention_numerics.py),
# then the pre-training step (`python -m bertjax.tools.benchmark`, bf16, layers
# scanned) of BERT-base and BERT-large at lengths 128 and 512 on real text
# (the offline demo corpus, prepared first), each as
#   paper:  XLA attention with attention dropout 0.1, padded rows;
#   xla:    XLA attention without attention dropout, padded rows (base at 128);
#   fused:  `auto` (cuDNN) attention, padded rows;
#   packed: `auto` attention, rows of up to 3 sequences.
# A configuration that fails prints {"config": ..., "error": ...} (a timeout
# says so). The whole script keeps to BUDGET_S (default 450 s) from its start:
# each step may take the least of its own limit (RUN_TIMEOUT_S, default 150 s,
# for a benchmark run) and what is left, and a run that would have less than
# MIN_RUN_S (default 30 s) prints "skipped".
# SIZES ("preset batch@128 batch@512", ';'-separated), LENGTHS ("128 512") and
# VOCAB_SIZE change the runs (tests/benchmarks/test_gpu_script.py runs the
# script so on a CPU, with a tiny model).
# MFU counts real tokens only (bertjax.flops.model_flops); docs/benchmarks.md
# holds the table.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

budget=${BUDGET_S:-450}
start=$(date +%s)
deadline=$((start + budget))
vocab_size=${VOCAB_SIZE:-30522}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export BERTJAX_CACHE_DIR="$work/cache"

limit() { # seconds a step may take: the least of $1 and what the budget has left (>= 1)
  local left=$((deadline - $(date +%s)))
  if ((left < 1)); then echo 1; elif ((left < $1)); then echo "$left"; else echo "$1"; fi
}

json_tail() { # the last $2 lines of the log $1, as a JSON string
  tail -n "$2" "$1" | python -c 'import json, sys; print(json.dumps(sys.stdin.read()[-1500:]))'
}

outcome() { # what exit status $1 of a step limited to $2 seconds means
  if (($1 == 124)); then echo "timed out after $2 s"; else echo "failed (exit status $1)"; fi
}

python - <<'EOF'
import json, jax
device = jax.devices()[0]
print(json.dumps({"environment": {"jax": jax.__version__, "platform": device.platform,
                                  "device_kind": device.device_kind,
                                  "devices": jax.device_count()}}))
EOF

seconds=$(limit 120)
timeout "$seconds" python benchmarks/attention_numerics.py 2>"$work/numerics.log"
status=$?
if ((status != 0)); then
  echo "{\"error\": \"the attention numerics $(outcome "$status" "$seconds")\", \"log\": $(json_tail "$work/numerics.log" 5)}"
fi

seconds=$(limit 120)
timeout "$seconds" python -m bertjax.tools.train_vocab --input=demo:stdlib \
  --output="$work/vocab.txt" --vocab_size="$vocab_size" >"$work/prepare.log" 2>&1
status=$?
if ((status == 0)); then
  seconds=$(limit 120)
  timeout "$seconds" python -m bertjax.tools.prepare_pretraining_data --input=demo:stdlib \
    --vocab="$work/vocab.txt" --output_dir="$work/data" --num_shards=4 >>"$work/prepare.log" 2>&1
  status=$?
fi
if ((status != 0)); then
  echo "{\"error\": \"preparing the demo data $(outcome "$status" "$seconds")\", \"log\": $(json_tail "$work/prepare.log" 3)}"
  exit 1
fi

run() { # name size length batch attention attention_dropout sequences_per_row
  local name=$1 size=$2 length=$3 batch=$4 attention=$5 dropout=$6 rows=$7
  local config="{\"config\": \"$name\", \"size\": \"$size\", \"seq_len\": $length"
  local seconds out status
  seconds=$(limit "${RUN_TIMEOUT_S:-150}")
  if ((seconds < ${MIN_RUN_S:-30})); then
    echo "$config, \"skipped\": \"$seconds s left for it (under ${MIN_RUN_S:-30} s) of the ${budget} s budget\"}"
    return
  fi
  out=$(timeout "$seconds" python -m bertjax.tools.benchmark --size="$size" --seq_len="$length" \
    --batch="$batch" --scan --dtype=bfloat16 --attention="$attention" \
    --attention_dropout="$dropout" --data_dir="$work/data" --sequences_per_row="$rows" \
    --vocab="$vocab_size" --steps=10 --warmup=2 --batches=4 2>"$work/err.log")
  status=$?
  if ((status == 0)); then
    echo "$config, \"result\": $(echo "$out" | tail -n 1)}"
  elif ((status == 124)); then
    echo "$config, \"error\": \"$(outcome "$status" "$seconds")\", \"log\": $(json_tail "$work/err.log" 3)}"
  else
    echo "$config, \"error\": $(json_tail "$work/err.log" 5)}"
  fi
}

IFS=';' read -r -a sizes <<<"${SIZES:-bert_base 256 64;bert_large 128 32}"
for size_batch in "${sizes[@]}"; do
  read -r size batch128 batch512 <<<"$size_batch"
  for length in ${LENGTHS:-128 512}; do
    batch=$batch128
    [ "$length" = 512 ] && batch=$batch512
    run paper "$size" "$length" "$batch" xla 0.1 1
    if [ "$size" = bert_base ] && [ "$length" = 128 ]; then
      run xla "$size" "$length" "$batch" xla 0.0 1
    fi
    run fused "$size" "$length" "$batch" auto 0.0 1
    run packed "$size" "$length" "$batch" auto 0.0 3
  done
done
echo "{\"total_s\": $(($(date +%s) - start))}"
