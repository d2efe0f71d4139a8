#include "services/node/node_metrics.h"

#include <string>
#include <vector>

#include "base/process_memory.h"

namespace kvd::node {

void DeclareNodeMetrics(Metrics& m) {
  m.DeclareGauge("kvd_sessions",
                 "Sessions by state (hot: K/V in memory; dram: checkpoint in "
                 "the host-DRAM tier, hot or not).");
  m.DeclareGauge("kvd_store_bytes", "Session bytes per storage tier.");
  m.DeclareGauge("kvd_engine_hot_bytes",
                 "Bytes held by hot sessions, by kind (kv, residual).");
  m.DeclareCounter("kvd_session_resumes_total",
                   "Session turns by how their state was obtained.");
  m.DeclareCounter("kvd_turns_total", "Session turns by outcome.");
  m.DeclareHistogram(
      "kvd_session_restore_seconds",
      "Time a session turn spent obtaining the session's "
      "state: loading its checkpoint and recomputing its K/V "
      "from residuals (or re-prefilling), by state path.",
      {0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10});
  m.DeclareGauge("kvd_kv_pool_blocks",
                 "K/V block pool: used, peak and total (0: no limit) blocks "
                 "of kvd_kv_pool_block_bytes each.");
  m.DeclareGauge("kvd_kv_pool_block_bytes", "Bytes per K/V pool block.");
  m.DeclareCounter("kvd_session_restore_pauses_total",
                   "Times a session restore had spent its share of a "
                   "scheduler step and let the running batch take one.");
  m.DeclareCounter("kvd_session_restores_streamed_total",
                   "Restores from RocksDB that rebuilt each layer's K/V as "
                   "soon as it was read, while later layers were still "
                   "being read.");
  m.DeclareCounter("kvd_sessions_demoted_total",
                   "Idle sessions whose hot K/V were dropped (their "
                   "checkpoint stays), by reason.");
  m.DeclareGauge("process_resident_memory_bytes",
                 "Resident memory of the server process (VmRSS).");
  m.DeclareGauge("kvd_process_peak_resident_memory_bytes",
                 "High-water mark of resident memory (VmHWM).");
  m.DeclareGauge("kvd_heap_bytes",
                 "malloc's books (mallinfo2): in_use = handed to the "
                 "program, free = kept in its arenas (resident or trimmed).");
  m.DeclareCounter("kvd_heap_trimmed_bytes_total",
                   "Resident bytes returned to the kernel by the memory "
                   "trimmer (malloc_trim).");
  // CPU tensor parallelism (--tensor-parallel-size N --backend cpu): the
  // shard workers, as of their last replies, by rank (1 .. N-1; the leader
  // is shard 0). Counters restart with a worker.
  m.DeclareGauge("kvd_shard_workers", "Shard worker processes running.");
  m.DeclareCounter("kvd_shard_worker_restarts_total",
                   "Times the shard workers were restarted after a failure.");
  m.DeclareCounter("kvd_shard_residual_bytes_received_total",
                   "Residual bytes a shard worker received to recompute its "
                   "heads' K/V from (restores, partial prefills).");
  m.DeclareCounter("kvd_shard_rows_recomputed_total",
                   "Layer rows of K/V a shard worker recomputed from "
                   "residuals.");
  m.DeclareCounter("kvd_shard_recompute_seconds_total",
                   "Time a shard worker spent recomputing K/V.");
  m.DeclareCounter("kvd_shard_forward_seconds_total",
                   "Time a shard worker spent in forward steps (including "
                   "waiting for the other shards' partial sums).");
  m.DeclareGauge("kvd_shard_kv_bytes",
                 "K/V bytes a shard worker holds for its heads.");
}

void UpdateNodeGauges(NodeRuntime& runtime, Metrics& m) {
  auto set = [&m](const char* name, const MetricLabels& labels, auto value) {
    m.Set(name, labels, static_cast<double>(value));
  };
  const engine::EngineStats stats = runtime.engine().stats();
  set("kvd_sessions", {{"state", "hot"}}, stats.hot_sessions);
  set("kvd_engine_hot_bytes", {{"kind", "kv"}}, stats.hot_kv_bytes);
  set("kvd_engine_hot_bytes", {{"kind", "residual"}}, stats.hot_residual_bytes);
  set("kvd_kv_pool_blocks", {{"state", "used"}}, stats.kv_pool_blocks_used);
  set("kvd_kv_pool_blocks", {{"state", "peak"}}, stats.kv_pool_blocks_peak);
  set("kvd_kv_pool_blocks", {{"state", "total"}}, stats.kv_pool_blocks_total);
  set("kvd_session_restore_pauses_total", {}, stats.restore_pauses);
  set("kvd_session_restores_streamed_total", {}, stats.restores_streamed);
  set("kvd_kv_pool_block_bytes", {}, stats.kv_pool_block_bytes);
  set("kvd_sessions_demoted_total", {{"reason", "kv_pool_full"}},
      stats.sessions_demoted_for_kv);
  set("kvd_sessions_demoted_total", {{"reason", "hot_limits"}},
      stats.sessions_demoted - stats.sessions_demoted_for_kv);
  for (const auto& [path, count] : stats.restores_by_path) {
    set("kvd_session_resumes_total", {{"path", path}}, count);
  }
  set("kvd_turns_total", {{"outcome", "committed"}}, stats.turns_committed);
  set("kvd_turns_total", {{"outcome", "failed"}}, stats.turns_failed);
  // A retried request id answered with its turn's stored reply.
  set("kvd_turns_total", {{"outcome", "replayed"}}, stats.turns_replayed);
  const storage::TierBytes bytes = runtime.store().bytes();
  set("kvd_store_bytes", {{"tier", "dram"}}, bytes.dram_bytes);
  set("kvd_sessions", {{"state", "dram"}},
      runtime.store().dram_stats().entries);
  set("kvd_store_bytes", {{"tier", "dram_spill_pending"}},
      bytes.dram_spill_pending_bytes);
  set("kvd_store_bytes", {{"tier", "rocksdb"}}, bytes.rocksdb_disk_bytes);
  const ProcessMemory memory = ReadProcessMemory();
  set("process_resident_memory_bytes", {}, memory.rss_bytes);
  set("kvd_process_peak_resident_memory_bytes", {}, memory.peak_rss_bytes);
  set("kvd_heap_bytes", {{"state", "in_use"}}, memory.heap_in_use_bytes);
  set("kvd_heap_bytes", {{"state", "free"}}, memory.heap_free_bytes);
  if (const MemoryTrimmer* trimmer = runtime.memory_trimmer()) {
    set("kvd_heap_trimmed_bytes_total", {}, trimmer->stats().released_bytes);
  }
  if (const worker::ShardGroup* group = runtime.shard_group()) {
    const std::vector<worker::ShardWorkerInfo> workers = group->workers();
    set("kvd_shard_workers", {}, workers.size());
    set("kvd_shard_worker_restarts_total", {}, group->restarts());
    for (const worker::ShardWorkerInfo& w : workers) {
      const MetricLabels rank = {{"rank", std::to_string(w.rank)}};
      set("kvd_shard_residual_bytes_received_total", rank,
          w.stats.residual_bytes_received());
      set("kvd_shard_rows_recomputed_total", rank, w.stats.rows_recomputed());
      set("kvd_shard_recompute_seconds_total", rank,
          w.stats.recompute_seconds());
      set("kvd_shard_forward_seconds_total", rank, w.stats.forward_seconds());
      set("kvd_shard_kv_bytes", rank, w.stats.kv_bytes());
    }
  }
}

}  // namespace kvd::node
