// Cloud providers: OpenAI-compatible endpoints categories may fall back to. Their keys live in
// the keyring (see secrets.ts); a provider only names its entry.

import { call, seg } from "./client";
import type { ListedProvider, Provider, ProviderTest } from "./types";

/** `GET /admin/providers`: each provider's config and whether its key is set. */
export function listProviders(): Promise<ListedProvider[]> {
  return call<ListedProvider[]>("GET", "/admin/providers");
}

/** `PUT /admin/providers`: the whole list at once; answers the list now running. */
export function replaceProviders(providers: Provider[]): Promise<Provider[]> {
  return call<Provider[]>("PUT", "/admin/providers", { json: providers });
}

/** `POST /admin/providers/{name}/test`: ask it for one token with its key and model map. */
export function testProvider(name: string): Promise<ProviderTest> {
  return call<ProviderTest>("POST", `/admin/providers/${seg(name)}/test`);
}
