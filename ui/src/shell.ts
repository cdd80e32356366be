// What the desktop shell does when there is one (Tauri commands are for shell things: file
// dialogs, the window), with the browser's way when there is none.

/** Save `text` as a file: through the desktop shell's save dialog, else a download. */
export async function saveFile(name: string, text: string, type = "text/plain") {
  const tauri = (window as any).__TAURI_INTERNALS__;
  if (tauri?.invoke) {
    await tauri.invoke("save_file", { name, text });
    return;
  }
  const url = URL.createObjectURL(new Blob([text], { type }));
  const a = document.createElement("a");
  a.href = url;
  a.download = name;
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}
