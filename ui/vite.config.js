import { defineConfig } from "vite";
import { svelte } from "@sveltejs/vite-plugin-svelte";

// Served by Corral's admin listener under /ui/ (and embedded into the binary from dist/).
export default defineConfig({
  base: "/ui/",
  plugins: [svelte()],
  build: { outDir: "dist", emptyOutDir: true, target: "es2020" },
  server: { proxy: { "/admin": "http://127.0.0.1:11402", "/metrics": "http://127.0.0.1:11402", "/help": "http://127.0.0.1:11402" } },
});
