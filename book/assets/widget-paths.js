// Point RequireJS at the ipywidgets HTML manager this site serves itself (in _static/html-manager).
// The manager's webpack bundles find their fonts relative to the module URLs that RequireJS
// computes; left alone those resolve next to the page (404) or on a CDN (offline: nothing).
(function () {
  var root = document.documentElement.dataset.content_root || "./";
  var manager = new URL(root + "_static/html-manager", document.baseURI).href;
  window.requirejs.config({
    paths: { "@jupyter-widgets/html-manager/dist": manager, "@jupyter-widgets": manager },
  });
})();

// The manager typesets widget labels with the MathJax 2 API (MathJax.Hub.Queue); this book
// loads MathJax 3. Once MathJax 3 is on the page (deferred scripts run before
// DOMContentLoaded), give it a Hub whose Queue forwards to MathJax 3's typesetPromise.
document.addEventListener("DOMContentLoaded", function () {
  var mathjax = window.MathJax;
  if (!mathjax || mathjax.Hub) return;
  mathjax.Hub = {
    Queue: function (job) {
      var ready = mathjax.startup ? mathjax.startup.promise : Promise.resolve();
      ready.then(function () { return mathjax.typesetPromise([job[2]]); }).catch(console.warn);
    },
  };
});
