// TensorBoard loads this module in the tab's iframe (frontend_metadata's es_module_path) and calls render():
// the page is a plain HTML file beside it, so it opens that (the iframe's base is this plugin's folder).
export async function render() {
  document.location.href = "index.html";
}
