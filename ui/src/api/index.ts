// The admin API, the only thing the UI talks to (so it runs the same in the desktop window and
// in a browser against `corral serve`): one typed function per endpoint. Screens import from
// here and never build a path.

export { ApiError, getToken, setToken, onTokenRejected, TOKEN_REFUSED } from "./client";
export * from "./settings";
export * from "./status";
export * from "./nodes";
export * from "./categories";
export * from "./providers";
export * from "./secrets";
export * from "./config";
export * from "./requests";
export * from "./charts";
export * from "./models";
export * from "./brokers";
export * from "./events";
export type * from "./types";
