"""Drawing and display objects: graphviz drawings and the timeline (render), text/HTML reports
(display), the Pareto chart (pareto). Never imports `flowmagic.flow`."""
