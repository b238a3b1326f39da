/**
 * The registry of every built-in plugin type. Adding a plugin is one definition file plus one line
 * here.
 */
import { coreMetricsExtractorDefinition, endpointNotificationSourceDefinition, metricsDataSourceDefinition } from '../datalayer/llm-d-data-plugins.js';
import { flowControlPolicyDefinitions } from '../flowcontrol/policies/index.js';
import { concurrencyDetectorDefinition } from '../saturation/concurrency-detector.js';
import { utilizationDetectorDefinition } from '../saturation/utilization-detector.js';
import { activeRequestScorerDefinition } from '../scheduling/plugins/active-request-scorer.js';
import { alwaysDisaggPdDeciderDefinition } from '../scheduling/plugins/always-disagg-pd-decider.js';
import { approxPrefixCacheProducerDefinition } from '../scheduling/plugins/approx-prefix-cache-producer.js';
import { decodeFilterDefinition } from '../scheduling/plugins/decode-filter.js';
import { encodeFilterDefinition } from '../scheduling/plugins/encode-filter.js';
import { disaggProfileHandlerDefinition } from '../scheduling/plugins/disagg-profile-handler.js';
import { kvCacheScorerDefinition, kvCacheUtilizationScorerDefinition } from '../scheduling/plugins/kv-cache-utilization-scorer.js';
import { loadAwareScorerDefinition } from '../scheduling/plugins/load-aware-scorer.js';
import { labelSelectorFilterDefinition } from '../scheduling/plugins/label-selector-filter.js';
import { llmdNoOpDefinitions } from '../scheduling/plugins/llm-d-no-ops.js';
import { loraAffinityScorerDefinition } from '../scheduling/plugins/lora-affinity-scorer.js';
import { maxScorePickerDefinition } from '../scheduling/plugins/max-score-picker.js';
import { noHitLruScorerDefinition } from '../scheduling/plugins/no-hit-lru-scorer.js';
import { pdProfileHandlerDefinition } from '../scheduling/plugins/pd-profile-handler.js';
import { prefillFilterDefinition } from '../scheduling/plugins/prefill-filter.js';
import { prefixBasedPdDeciderDefinition } from '../scheduling/plugins/prefix-based-pd-decider.js';
import { prefixCacheAffinityFilterDefinition } from '../scheduling/plugins/prefix-cache-affinity-filter.js';
import { prefixCacheScorerDefinition } from '../scheduling/plugins/prefix-cache-scorer.js';
import { queueScorerDefinition } from '../scheduling/plugins/queue-scorer.js';
import { randomPickerDefinition } from '../scheduling/plugins/random-picker.js';
import { runningRequestsSizeScorerDefinition } from '../scheduling/plugins/running-requests-size-scorer.js';
import { sessionAffinityScorerDefinition } from '../scheduling/plugins/session-affinity-scorer.js';
import { singleProfileHandlerDefinition } from '../scheduling/plugins/single-profile-handler.js';
import { tokenLoadScorerDefinition } from '../scheduling/plugins/token-load-scorer.js';
import { weightedRandomPickerDefinition } from '../scheduling/plugins/weighted-random-picker.js';
import { PluginRegistry } from './registry.js';

export function builtinRegistry(): PluginRegistry {
  const registry = new PluginRegistry()
    // profile handlers
    .register(singleProfileHandlerDefinition)
    .register(disaggProfileHandlerDefinition)
    .register(pdProfileHandlerDefinition)
    // P/D deciders
    .register(prefixBasedPdDeciderDefinition)
    .register(alwaysDisaggPdDeciderDefinition)
    // filters
    .register(decodeFilterDefinition)
    .register(prefillFilterDefinition)
    .register(encodeFilterDefinition)
    .register(labelSelectorFilterDefinition)
    .register(prefixCacheAffinityFilterDefinition)
    // scorers
    .register(queueScorerDefinition)
    .register(kvCacheUtilizationScorerDefinition)
    .register(kvCacheScorerDefinition)
    .register(loadAwareScorerDefinition)
    .register(activeRequestScorerDefinition)
    .register(prefixCacheScorerDefinition)
    .register(runningRequestsSizeScorerDefinition)
    .register(loraAffinityScorerDefinition)
    .register(sessionAffinityScorerDefinition)
    .register(noHitLruScorerDefinition)
    .register(tokenLoadScorerDefinition)
    // llm-d plugins whose work another plugin does here: accepted with a warning
    .register(approxPrefixCacheProducerDefinition)
    // pickers
    .register(maxScorePickerDefinition)
    .register(randomPickerDefinition)
    .register(weightedRandomPickerDefinition)
    // saturation detectors
    .register(utilizationDetectorDefinition);
  registry.register(concurrencyDetectorDefinition);
  for (const def of llmdNoOpDefinitions) registry.register(def);
  // llm-d's data layer: settings of pool.metrics here
  registry.register(metricsDataSourceDefinition).register(coreMetricsExtractorDefinition).register(endpointNotificationSourceDefinition);
  // flow-control policies
  for (const def of flowControlPolicyDefinitions) registry.register(def);
  return registry;
}
