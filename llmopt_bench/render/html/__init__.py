"""The report people open: one self-contained HTML file per run (report.html) and across runs
(runs.html), every script, style and datum inside, opened from disk with no network request
(docs/report.md). page.py writes the file; data.py reads a run; journey, serving, tune and runs
build the sections; app.js lays them out in the browser with plotly.js, which plotly's Python
package ships and page.py inlines once."""
