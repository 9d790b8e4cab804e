// Stand-ins the socket-shell tests share (shell, react and persist tests): a WebSocket the
// test plays the hub through, and timers it fires by hand. No tests here.

/** A WebSocket stand-in: records what is sent; the test plays the hub. */
export class FakeSocket {
  /** @type {FakeSocket[]} every socket made, in order (a test resets it) */
  static made = [];
  constructor(url, protocol) {
    this.url = url;
    this.protocol = protocol;
    this.readyState = 0;
    this.sent = [];
    FakeSocket.made.push(this);
  }
  open() {
    this.readyState = 1;
    this.onopen?.({});
  }
  send(data) {
    this.sent.push(JSON.parse(data));
  }
  deliver(message) {
    this.onmessage?.({ data: JSON.stringify(message) });
  }
  /** The push frames sent so far. */
  pushes() {
    return this.sent.filter((frame) => frame.type === 'push');
  }
  /** As a browser reports a close that carried no status code: 1005. */
  close(code = 1005, reason = '') {
    if (this.readyState === 3) return;
    this.readyState = 3;
    this.onclose?.({ code, reason });
  }
}

/** Timers the test fires by hand (a replica's backoff, a registry's grace). */
export function manualTimers() {
  const pending = [];
  return {
    pending,
    setTimeout: (fn, ms) => {
      const timer = { fn, ms };
      pending.push(timer);
      return timer;
    },
    clearTimeout: (timer) => {
      const at = pending.indexOf(timer);
      if (at >= 0) pending.splice(at, 1);
    },
    fire() {
      const timer = pending.shift();
      timer.fn();
      return timer.ms;
    },
  };
}
