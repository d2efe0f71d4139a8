// The node-wide Prometheus families a front end exports next to its own
// request metrics: sessions, the engine's hot state and K/V pool, bytes per
// storage tier, session restores, and the process's memory. Their values
// live in the components (SessionEngine::stats(), TieredStore::bytes(),
// ReadProcessMemory()), so UpdateNodeGauges copies them in just before a
// scrape renders.
//
//   DeclareNodeMetrics(metrics);                  // once, at start
//   UpdateNodeGauges(runtime, metrics);           // per GET /metrics
//   std::string text = metrics.Render();
//
// Thread-safety: as Metrics and NodeRuntime (both may be called from any
// thread).
#ifndef KVD_SERVICES_NODE_NODE_METRICS_H_
#define KVD_SERVICES_NODE_NODE_METRICS_H_

#include "services/node/metrics.h"
#include "services/node/runtime.h"

namespace kvd::node {

void DeclareNodeMetrics(Metrics& m);
void UpdateNodeGauges(NodeRuntime& runtime, Metrics& m);

}  // namespace kvd::node

#endif  // KVD_SERVICES_NODE_NODE_METRICS_H_
