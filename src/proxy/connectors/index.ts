/** The connectors by name (the `connector` parameter of `disagg-profile-handler`). */
import type { ConnectorName } from '../../scheduling/framework.js';
import { nixlv2Connector } from './nixlv2.js';
import { sharedStorageConnector } from './shared-storage.js';
import { sidecarConnector } from './sidecar.js';
import type { Connector } from './types.js';

const CONNECTORS: Readonly<Record<ConnectorName, Connector>> = {
  sidecar: sidecarConnector,
  nixlv2: nixlv2Connector,
  'shared-storage': sharedStorageConnector,
};

export function connectorFor(name: ConnectorName): Connector {
  return CONNECTORS[name];
}

export type { Connector } from './types.js';
