// The one script of the page: "live" reloads the page every 5 s while a run is going (remembered per browser).
"use strict";
(function () {
  const box = document.getElementById("live");
  if (!box) return;
  box.checked = localStorage.getItem("tether-live") === "1";
  let timer = null;
  function schedule() {
    if (timer) clearTimeout(timer);
    timer = box.checked ? setTimeout(function () { location.reload(); }, 5000) : null;
  }
  box.addEventListener("change", function () {
    localStorage.setItem("tether-live", box.checked ? "1" : "0");
    schedule();
  });
  schedule();
})();
