// The fleet's brokers (several brokers on one PostgreSQL).

import { call } from "./client";
import type { Brokers } from "./types";

/** `GET /admin/brokers`: address, version, config version, last seen, load, keeper, gone. */
export function getBrokers(): Promise<Brokers> {
  return call<Brokers>("GET", "/admin/brokers");
}
