/**
 * A bound on what a request body makes `JSON.parse` build, checked before it runs. Parsing costs
 * per array and object, not per byte: 8 MiB of `[[[…]]]` took about a second of the one event loop
 * (every other request waited), where 8 MiB of prompt text takes 10 ms. OpenAI requests hold a few
 * thousand arrays and objects at most (messages, content parts, tool schemas), nested a few dozen
 * deep; vLLM's Python parser refuses nesting near 1 000 levels anyway.
 *
 * The scan reads the bytes between strings one by one and jumps over each string with `indexOf`
 * (the bulk of a prompt's bytes), so it costs little next to the parse. It decides only depth and
 * count: whether the text is valid JSON is `JSON.parse`'s to say.
 */

export const MAX_JSON_DEPTH = 1000;
export const MAX_JSON_CONTAINERS = 100_000;

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const LBRACKET = 0x5b;
const RBRACKET = 0x5d;
const LBRACE = 0x7b;
const RBRACE = 0x7d;

/** Why the JSON text in `bytes` nests too deeply or holds too many arrays and objects; undefined when it does not. */
export function jsonShapeProblem(bytes: Buffer, maxDepth = MAX_JSON_DEPTH, maxContainers = MAX_JSON_CONTAINERS): string | undefined {
  let depth = 0;
  let containers = 0;
  const n = bytes.length;
  for (let i = 0; i < n; i++) {
    const c = bytes[i];
    if (c === QUOTE) {
      i = stringEnd(bytes, i);
      if (i < 0) return undefined; // unterminated: JSON.parse says so
    } else if (c === LBRACKET || c === LBRACE) {
      if (++depth > maxDepth) return `request JSON nests arrays and objects more than ${maxDepth} levels deep`;
      if (++containers > maxContainers) return `request JSON holds more than ${maxContainers} arrays and objects`;
    } else if (c === RBRACKET || c === RBRACE) depth--;
  }
  return undefined;
}

/** Index of the quote that closes the string opening at `open` (-1 when none does). */
function stringEnd(bytes: Buffer, open: number): number {
  let at = open;
  for (;;) {
    at = bytes.indexOf(QUOTE, at + 1);
    if (at < 0) return -1;
    let backslashes = 0;
    while (bytes[at - 1 - backslashes] === BACKSLASH) backslashes++;
    if ((backslashes & 1) === 0) return at;
  }
}
