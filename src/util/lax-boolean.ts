const LAX_TRUE = new Set(['1', 'on', 't', 'true', 'y', 'yes']);
const LAX_FALSE = new Set(['0', 'off', 'f', 'false', 'n', 'no']);

/**
 * A flag as vLLM reads it (pydantic's lax bool): booleans, 0 and 1, and "true"/"false",
 * "yes"/"no", "on"/"off", "t"/"f", "y"/"n", "1"/"0" in any case; else undefined. The gateway
 * forwards a body as sent, so a client's `"stream": "true"` streams at vLLM and must be relayed as one.
 */
export function laxBoolean(v: unknown): boolean | undefined {
  if (typeof v === 'boolean') return v;
  if (v === 0 || v === 1) return v === 1;
  if (typeof v !== 'string') return undefined;
  const s = v.toLowerCase();
  return LAX_TRUE.has(s) ? true : LAX_FALSE.has(s) ? false : undefined;
}
