// kvdrive/research.hpp: the research tools on top of the engine: decode traces (recorded from a
// model or synthetic), the oracles' and the indices' evaluation on them, the cache studies
// (Belady's bound, replays, window profiles) and their metrics. What kvd-eval, the benchmarks and
// the analysis tests use. An engine needs none of it: kvdrive/kvdrive.hpp is the manager, the
// policies and the tiers alone. This header includes that one too, so a tool needs only this.
#pragma once

#include "kvdrive/kvdrive.hpp"

#include "kvdrive/eval/any_index.hpp"
#include "kvdrive/eval/belady.hpp"
#include "kvdrive/eval/cache_replay.hpp"
#include "kvdrive/eval/cache_study.hpp"
#include "kvdrive/eval/evaluate.hpp"
#include "kvdrive/eval/layer_inputs.hpp"
#include "kvdrive/eval/metrics.hpp"
#include "kvdrive/eval/recorded.hpp"
#include "kvdrive/eval/stream_stats.hpp"
#include "kvdrive/eval/stream_trace.hpp"
#include "kvdrive/eval/synthetic.hpp"
#include "kvdrive/eval/synthetic_preset.hpp"
#include "kvdrive/eval/synthetic_spec.hpp"
#include "kvdrive/eval/trace.hpp"
#include "kvdrive/eval/trace_stats.hpp"
#include "kvdrive/eval/window_profile.hpp"
