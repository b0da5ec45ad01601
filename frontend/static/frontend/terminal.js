// The web terminal: xterm.js (vendored from npm) over a WebSocket to the gateway.
// Binary messages are the terminal's bytes both ways; text messages are JSON control:
// {"resize": [cols, rows]} from here, {"exit": status} or {"closed": reason} from the gateway.
(function () {
  "use strict";
  function start() {
    const box = document.getElementById("terminal");
    if (!box || !window.Terminal) return;
    const status = document.getElementById("terminal-status");
    const term = new window.Terminal({cursorBlink: true, fontSize: 14, convertEol: false});
    const fit = new window.FitAddon.FitAddon();
    term.loadAddon(fit);
    term.open(box);
    fit.fit();
    window.gpucloudTerminal = term;  // for the console's browser tests
    const ws = new WebSocket(box.dataset.wsUrl);
    ws.binaryType = "arraybuffer";
    const encoder = new TextEncoder();
    const resize = () => {
      if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({resize: [term.cols, term.rows]}));
    };
    ws.onopen = () => { status.textContent = "connected"; resize(); term.focus(); };
    ws.onmessage = (e) => {
      if (typeof e.data === "string") {
        const msg = JSON.parse(e.data);
        if ("exit" in msg) status.textContent = "the shell exited (status " + msg.exit + ")";
        if ("closed" in msg) status.textContent = msg.closed;
        return;
      }
      term.write(new Uint8Array(e.data));
    };
    ws.onclose = () => { if (status.textContent === "connected") status.textContent = "disconnected"; };
    term.onData((data) => { if (ws.readyState === WebSocket.OPEN) ws.send(encoder.encode(data)); });
    term.onResize(resize);
    window.addEventListener("resize", () => fit.fit());
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
