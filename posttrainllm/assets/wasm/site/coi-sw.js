// A service worker that makes the book's pages cross-origin isolated on a static host that
// cannot send headers of its own (GitHub Pages, a plain file server).
//
// WebAssembly threads share one memory through a SharedArrayBuffer, and a browser offers
// SharedArrayBuffer only to a cross-origin isolated page: one served with
//   Cross-Origin-Opener-Policy: same-origin      (no window of another site shares our process)
//   Cross-Origin-Embedder-Policy: require-corp   (every resource we embed agreed to be embedded)
// A service worker sits between the page and the network, so it can add both headers to every
// response from this site. The tiny-GPT cell registers it only when the reader asks for threads,
// then reloads once, because a page is isolated (or not) from the moment it loads.
self.addEventListener("install", () => self.skipWaiting());
self.addEventListener("activate", (event) => event.waitUntil(self.clients.claim()));

// Left alone, as posttrainllm/serve.py leaves them: the JupyterLite site (its Pyodide kernel is
// unreliable when isolated) and the page that embeds its REPL.
const NOT_ISOLATED = ["lite/", "book/in-your-browser.html"];

self.addEventListener("fetch", (event) => {
  const request = event.request;
  const url = new URL(request.url);
  if (url.origin !== self.location.origin) return;  // the book loads nothing else
  const path = url.pathname.slice(new URL(self.registration.scope).pathname.length);
  if (NOT_ISOLATED.some((prefix) => path.startsWith(prefix))) return;
  if (request.cache === "only-if-cached" && request.mode !== "same-origin") return;
  event.respondWith(fetch(request).then((response) => {
    if (response.status === 0) return response;  // opaque: nothing to add headers to
    const headers = new Headers(response.headers);
    headers.set("Cross-Origin-Opener-Policy", "same-origin");
    headers.set("Cross-Origin-Embedder-Policy", "require-corp");
    headers.set("Cross-Origin-Resource-Policy", "same-origin");
    return new Response(response.body, {status: response.status, statusText: response.statusText, headers});
  }));
});
