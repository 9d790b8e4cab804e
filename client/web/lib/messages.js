// @ts-check
// Messages and authors: the constructors and the few rules on them (`sync/messages.py`).

export const STOPPED = 'STOPPED';

/** Message constructors, as `sync.Message`. */
export const Message = Object.freeze({
  /** @param {string} text */
  system: (text) => ({ role: 'system', content: text }),
  /** @param {string} text */
  user: (text) => ({ role: 'user', content: [{ type: 'text', text }] }),
  /** @param {string} text @param {any} [stop] */
  assistant: (text, stop = null) => ({
    role: 'assistant',
    content: [{ type: 'text', text }],
    stop,
    origin: null,
    usage: null,
  }),
  /** @param {string} callId @param {string} name @param {string} text @param {boolean} [isError] */
  toolResult: (callId, name, text, isError = false) => ({
    role: 'user',
    content: [
      {
        type: 'tool_result',
        call_id: callId,
        name,
        content: [{ type: 'text', text }],
        is_error: isError,
      },
    ],
  }),
});

/** Author constructors, as `sync.Author`. */
export const Author = Object.freeze({
  /** @param {string | null} [title] */
  user: (title = null) => ({ kind: 'user', name: null, request: null, title }),
  /** @param {string} name @param {string | null} [request] */
  agent: (name, request = null) => ({ kind: 'agent', name, request, title: null }),
  /** @param {string} name */
  plugin: (name) => ({ kind: 'plugin', name, request: null, title: null }),
  rig: () => ({ kind: 'rig', name: null, request: null, title: null }),
});

/** @param {any} author */
function isRig(author) {
  return (
    author != null &&
    author.kind === 'rig' &&
    author.name == null &&
    author.request == null &&
    author.title == null
  );
}

/** Whether a message is an assistant reply cut short (its stop is `error` or `aborted`). */
export function isFailedReply(message) {
  const reason = message.role === 'assistant' && message.stop ? message.stop.reason : null;
  return reason === 'error' || reason === 'aborted';
}

/** Whether `entry` is the STOPPED note: a user message of only `Text("STOPPED")`, by the rig. */
export function isStopMarker(entry) {
  const content = entry.message.content;
  return (
    isRig(entry.author) &&
    entry.message.role === 'user' &&
    content.length === 1 &&
    content[0].type === 'text' &&
    content[0].text === STOPPED
  );
}
