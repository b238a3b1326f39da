/**
 * The source text of one top-level member of a JSON object, found without re-serialising it.
 *
 * Why: the prefix index hashes a chat request's `messages` as text. `JSON.stringify` of the parsed
 * array costs about 6 µs per 4 KB (twice what `JSON.parse` of the whole body costs) and grows with
 * the conversation, while the client already sent that text. The scan jumps over string contents
 * with `indexOf`, so its cost follows the number of strings, not their length.
 *
 * The input must be text that `JSON.parse` accepted. Like `JSON.parse`, the last of duplicate keys
 * wins. Anything this scanner does not handle (an escaped key, a malformed text) gives undefined,
 * and the caller falls back to `JSON.stringify` of the parsed value.
 */

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const COMMA = 0x2c;
const COLON = 0x3a;
const OPEN_BRACE = 0x7b;
const CLOSE_BRACE = 0x7d;
const OPEN_BRACKET = 0x5b;
const CLOSE_BRACKET = 0x5d;

const isSpace = (c: number): boolean => c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09;

export function skipSpace(text: string, i: number): number {
  while (i < text.length && isSpace(text.charCodeAt(i))) i++;
  return i;
}

/** Index of the quote closing the string that opens at `open`; -1 when unterminated. */
function stringEnd(text: string, open: number): number {
  let from = open + 1;
  for (;;) {
    const q = text.indexOf('"', from);
    if (q < 0) return -1;
    let k = q - 1;
    while (text.charCodeAt(k) === BACKSLASH) k--;
    if ((q - 1 - k) % 2 === 0) return q; // an even run of backslashes escapes only itself
    from = q + 1;
  }
}

/** Index just past the value that starts at `start`; -1 when malformed. */
function valueEnd(text: string, start: number): number {
  const first = text.charCodeAt(start);
  if (first === QUOTE) {
    const q = stringEnd(text, start);
    return q < 0 ? -1 : q + 1;
  }
  if (first === OPEN_BRACE || first === OPEN_BRACKET) {
    let depth = 0;
    for (let i = start; i < text.length; i++) {
      const c = text.charCodeAt(i);
      if (c === QUOTE) {
        i = stringEnd(text, i);
        if (i < 0) return -1;
      } else if (c === OPEN_BRACE || c === OPEN_BRACKET) depth++;
      else if (c === CLOSE_BRACE || c === CLOSE_BRACKET) {
        if (--depth === 0) return i + 1;
      }
    }
    return -1;
  }
  // number, true, false, null: up to the next delimiter
  let i = start;
  while (i < text.length) {
    const c = text.charCodeAt(i);
    if (c === COMMA || c === CLOSE_BRACE || c === CLOSE_BRACKET || isSpace(c)) break;
    i++;
  }
  return i > start ? i : -1;
}

/** Where `findMember` found things; `start` is -1 when the object has no member `key`. */
export interface MemberLookup {
  /** The value of the last member named `key`: its first index and the index past it. */
  start: number;
  end: number;
  /** Index of the object's closing brace. */
  close: number;
  /** How many members the object has. */
  members: number;
}

/**
 * Walks the members of the object whose `{` is at `open` into `out` (no allocation: the hot path
 * passes a reused one). False when the text is not handled (an escaped key, a malformed text).
 */
export function findMember(text: string, open: number, key: string, out: MemberLookup): boolean {
  out.start = -1;
  out.members = 0;
  let i = skipSpace(text, open + 1);
  if (text.charCodeAt(i) === CLOSE_BRACE) {
    out.close = i;
    return true;
  }
  for (;;) {
    if (text.charCodeAt(i) !== QUOTE) return false;
    const keyEnd = stringEnd(text, i);
    if (keyEnd < 0) return false;
    const keyLength = keyEnd - i - 1;
    // An escaped key may spell `key` differently; JSON.parse would see it, a literal compare would not.
    for (let k = i + 1; k < keyEnd; k++) if (text.charCodeAt(k) === BACKSLASH) return false;
    const matches = keyLength === key.length && text.startsWith(key, i + 1);
    i = skipSpace(text, keyEnd + 1);
    if (text.charCodeAt(i) !== COLON) return false;
    const start = skipSpace(text, i + 1);
    const end = valueEnd(text, start);
    if (end < 0) return false;
    if (matches) {
      out.start = start;
      out.end = end;
    }
    out.members++;
    i = skipSpace(text, end);
    const c = text.charCodeAt(i);
    if (c === CLOSE_BRACE) {
      out.close = i;
      return true;
    }
    if (c !== COMMA) return false;
    i = skipSpace(text, i + 1);
  }
}

const scratch: MemberLookup = { start: -1, end: -1, close: -1, members: 0 };

/** The text of the top-level member `key` of the JSON object `text`, or undefined (absent or not handled). */
export function topLevelMemberText(text: string, key: string): string | undefined {
  const open = skipSpace(text, 0);
  if (text.charCodeAt(open) !== OPEN_BRACE || !findMember(text, open, key, scratch) || scratch.start < 0) return undefined;
  return text.slice(scratch.start, scratch.end);
}

/**
 * A bound on what `JSON.parse` would build from `text`, checked before it runs. Parsing costs per
 * thing built, not per byte: 8 MiB of prompt text takes 10 ms, but 8 MiB of `[[[…]]]` took about a
 * second of the one event loop (every other request waited), a string costs about 0.5 µs (16 MiB
 * of short distinct strings, 2.3 million, held it 1–2.5 s) and a number about 0.05 µs. OpenAI
 * requests hold a few thousand arrays, objects and strings at most (messages, content parts, tool
 * schemas, an embeddings batch of 2 048 inputs), nested a few dozen deep; a prompt given as token
 * ids is one number per token. vLLM's Python parser refuses nesting near 1 000 levels itself.
 *
 * Like the member scan it jumps over strings with `indexOf` (the bulk of a prompt), so it costs
 * 0.1–1 µs on ordinary bodies (a prompt of token ids is scanned character by character: about as
 * long as JSON.parse takes). It decides only depth and counts: whether the text is valid JSON is
 * `JSON.parse`'s to say (an unterminated string ends the scan).
 */
export const MAX_JSON_DEPTH = 1000;
export const MAX_JSON_CONTAINERS = 100_000;
/** Strings, keys included: at most about 50 ms of parsing. */
export const MAX_JSON_STRINGS = 100_000;
/**
 * Values and members (counted by the commas between them): as many as a 16 MiB body (the default
 * `bodyLimit`) can hold, so no body within that limit meets it — an embeddings batch of 2 048 inputs
 * of up to 4 096 token ids each is vLLM's to take (LangChain sends token ids). Checking and parsing them
 * all takes up to 0.5–0.6 s (16 MiB of `1,`: a scan per character where there are no strings to
 * jump, then JSON.parse); only a raised `bodyLimit` needs the bound.
 */
export const MAX_JSON_VALUES = 8_388_608;

export interface JsonShapeLimits {
  depth: number;
  containers: number;
  strings: number;
  values: number;
}

const JSON_SHAPE_LIMITS: JsonShapeLimits = { depth: MAX_JSON_DEPTH, containers: MAX_JSON_CONTAINERS, strings: MAX_JSON_STRINGS, values: MAX_JSON_VALUES };

/** Why `text` nests too deeply or holds too many of what JSON.parse builds; undefined when it does not. */
export function jsonShapeProblem(text: string, limits: JsonShapeLimits = JSON_SHAPE_LIMITS): string | undefined {
  let depth = 0;
  let containers = 0;
  let strings = 0;
  let commas = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === QUOTE) {
      if (++strings > limits.strings) return `request JSON holds more than ${limits.strings} strings (keys included)`;
      i = stringEnd(text, i);
      if (i < 0) return undefined;
    } else if (c === OPEN_BRACE || c === OPEN_BRACKET) {
      if (++depth > limits.depth) return `request JSON nests arrays and objects more than ${limits.depth} levels deep`;
      if (++containers > limits.containers) return `request JSON holds more than ${limits.containers} arrays and objects`;
    } else if (c === CLOSE_BRACE || c === CLOSE_BRACKET) depth--;
    else if (c === COMMA && ++commas >= limits.values) return `request JSON holds more than ${limits.values} values`;
  }
  return undefined;
}
