// The notebooks' widgets on the book's static pages, where no Python kernel runs behind them.
// A study card's Save cannot write the reader's study queue from here, so it keeps the answer in
// this browser (localStorage) and shows the `posttrainllm study fill` command that saves it; a
// slider still moves, but the figure under it was drawn when the book was built, and a note next
// to it says so and where it does work. Loaded only on the built book (not in Jupyter).
(function () {
  "use strict";
  var KEY = "posttrainllm-study:";

  function quote(text) { // one shell word, as POSIX shells read it
    return "'" + text.replace(/'/g, "'\\''") + "'";
  }

  function cardOf(node) { // the study card (a widget box) that holds node, and its topic
    for (var box = node; box && box !== document.body; box = box.parentElement) {
      if (!box.classList || !box.classList.contains("widget-vbox")) continue;
      var title = box.querySelector("p b");
      if (title && title.textContent === "Study card:") {
        return {box: box, topic: title.parentElement.textContent.replace("Study card:", "").trim()};
      }
    }
    return null;
  }

  function note(card) {
    var existing = card.box.querySelector(".ptl-static-note");
    if (existing) return existing;
    var div = document.createElement("div");
    div.className = "ptl-static-note";
    div.style.cssText = "margin:0.4em 0;padding:0.4em 0.6em;border-left:3px solid #4a7ab5;background:#f4f7fb";
    card.box.append(div);
    return div;
  }

  function save(card) {
    var area = card.box.querySelector("textarea");
    var answer = area ? area.value.trim() : "";
    var replace = card.box.querySelector("input[type=checkbox]");
    var div = note(card);
    if (!answer) {
      div.textContent = "Write your answer above first.";
      return;
    }
    localStorage.setItem(KEY + card.topic, answer);
    var command = "posttrainllm study fill " + (replace && replace.checked ? "--force " : "") +
      quote(card.topic) + " " + quote(answer);
    div.replaceChildren(
      "This page has no Python behind it, so Save cannot write your study queue. Your answer is kept " +
      "in this browser; to save it, run this in your clone of the book (or open the notebook in " +
      "Jupyter, where Save writes it):");
    var code = document.createElement("pre");
    code.className = "ptl-static-command";
    code.style.cssText = "white-space:pre-wrap;margin:0.3em 0 0";
    code.textContent = command;
    div.append(code);
  }

  document.addEventListener("click", function (event) {
    var button = event.target.closest && event.target.closest("button");
    if (!button || button.textContent.trim() !== "Save") return;
    var card = cardOf(button);
    if (card) save(card);
  });

  function explain(root) { // restore kept answers; put a note beside each slider once
    root.querySelectorAll(".widget-vbox").forEach(function (box) {
      var card = cardOf(box);
      var area = card && card.box === box && box.querySelector("textarea");
      var kept = area && localStorage.getItem(KEY + card.topic);
      if (kept && !area.value) area.value = kept;
    });
    root.querySelectorAll(".jp-OutputArea-output, .cell_output").forEach(function (out) {
      if (!out.querySelector(".widget-slider") || out.querySelector(".ptl-static-slider-note")) return;
      var p = document.createElement("p");
      p.className = "ptl-static-slider-note";
      p.style.cssText = "font-size:0.9em;color:#555";
      p.textContent = "The figure here was drawn when the book was built: the slider moves, but redrawing " +
        "needs the notebook running, in Jupyter (make lab); modules 1–7 also run in their browser edition.";
      out.prepend(p);
    });
  }

  new MutationObserver(function () { explain(document); })
    .observe(document.documentElement, {childList: true, subtree: true});
})();
