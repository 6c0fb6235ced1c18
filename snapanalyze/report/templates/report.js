// Draw every figure div (class sa-figure) from the JSON data block whose id is the div id + "-data".
(function () {
  "use strict";
  var config = { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["sendDataToCloud", "editInChartStudio"] };
  var divs = document.querySelectorAll("div.sa-figure");
  for (var i = 0; i < divs.length; i++) {
    var div = divs[i];
    var data = document.getElementById(div.id + "-data");
    if (!data) { continue; }
    var spec = JSON.parse(data.textContent);
    Plotly.newPlot(div, spec.data, spec.layout, config);
  }
})();
