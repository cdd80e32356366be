// What the desktop shell does when there is one (Tauri commands are for shell things: file
// dialogs, the window), with the browser's way when there is none.

/** Show the outcome of a save for a few seconds (an error stays until clicked). */
function tell(text: string, bad: boolean) {
  document.querySelector("[data-testid=save-notice]")?.remove();
  const el = document.createElement("div");
  el.dataset.testid = "save-notice";
  el.setAttribute("role", bad ? "alert" : "status");
  el.textContent = text;
  el.title = bad ? "Click to close" : "";
  Object.assign(el.style, {
    position: "fixed", right: "16px", bottom: "16px", zIndex: "10", maxWidth: "min(560px, 90vw)",
    padding: "10px 14px", borderRadius: "6px", fontSize: "14px", overflowWrap: "anywhere", cursor: "pointer",
    background: "var(--panel)", color: bad ? "var(--bad)" : "var(--ink)",
    border: `1px solid ${bad ? "var(--bad)" : "var(--line)"}`, borderLeft: `5px solid ${bad ? "var(--bad)" : "var(--ok)"}`,
    boxShadow: "0 2px 8px rgba(0,0,0,.15)",
  });
  el.onclick = () => el.remove();
  document.body.appendChild(el);
  if (!bad) setTimeout(() => el.remove(), 6000);
}

/** Save `text` as a file: through the desktop shell's native save dialog (the file is written
 * by the shell, which says where it went or what failed), else a browser download. Never
 * throws: the outcome is shown. Returns the path written in the desktop, null otherwise. */
export async function saveFile(name: string, text: string, type = "text/plain"): Promise<string | null> {
  const tauri = (window as any).__TAURI_INTERNALS__;
  if (tauri?.invoke) {
    try {
      const path: string | null = await tauri.invoke("save_file", { name, text });
      if (path) tell(`Saved to ${path}`, false);
      return path;
    } catch (e: any) {
      tell(`Could not save ${name}: ${e?.message ?? e}`, true);
      return null;
    }
  }
  const url = URL.createObjectURL(new Blob([text], { type }));
  const a = document.createElement("a");
  a.href = url;
  a.download = name;
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
  return null;
}
