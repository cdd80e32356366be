// Request categories: how a node is picked, how urgent a request is, how long it may wait and
// whether it may go to a cloud provider. The whole set is validated before anything changes.

import { call, seg } from "./client";
import type { Category } from "./types";

/** `GET /admin/categories`. */
export function listCategories(): Promise<Category[]> {
  return call<Category[]>("GET", "/admin/categories");
}

/** `PUT /admin/categories`: the whole set at once; answers the set now running. */
export function replaceCategories(categories: Category[]): Promise<Category[]> {
  return call<Category[]>("PUT", "/admin/categories", { json: categories });
}

/** `GET /admin/categories/{name}`. */
export function getCategory(name: string): Promise<Category> {
  return call<Category>("GET", `/admin/categories/${seg(name)}`);
}

/** `PUT /admin/categories/{name}`: replace or add one (the name in the path wins). */
export function saveCategory(name: string, category: Category): Promise<Category> {
  return call<Category>("PUT", `/admin/categories/${seg(name)}`, { json: category });
}

/** `DELETE /admin/categories/{name}`. */
export function deleteCategory(name: string): Promise<void> {
  return call<void>("DELETE", `/admin/categories/${seg(name)}`);
}
