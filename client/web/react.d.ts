// Types of react.js, the React bindings of the JavaScript replica (React >= 18, a peer
// dependency of this module only). Kept by hand, as convsync.d.ts.
import type {
  Approval,
  ConnectOptions,
  ConnectionState,
  Draft,
  Entry,
  PresenceItem,
  Replica,
} from './convsync.js';

/** How long a replica nobody holds stays open, in case it is mounted again (ms). */
export const GRACE_MS: number;

/** `connect`'s options (`live` defaults to true here), and the registry's `grace` in ms. */
export type ReplicaOptions = ConnectOptions & { grace?: number };

/** The conversation as it is here, pending edits included; frozen. */
export interface ConversationSnapshot {
  /** Oldest first; an entry that did not change is the same object as before. */
  readonly entries: readonly Entry[];
  readonly halt: 'stopped' | 'kept' | null;
  readonly revision: number;
  /** Edits made here that the hub has not acknowledged yet. */
  readonly pending: number;
}

/** An approval or question with its aside's id (for `replica.decide(id, ...)`); frozen. */
export type ApprovalSnapshot = Readonly<Approval & { id: string; mayDecide: boolean }>;

/** A frozen copy of a draft; a token makes a new copy of its draft only. */
export type DraftSnapshot = Readonly<
  Omit<Draft, 'parts' | 'names' | 'lengths'> & {
    parts: Readonly<Record<string, string>>;
    names: Readonly<Record<string, string | null>>;
    lengths: Readonly<Record<string, number>>;
  }
>;

/** A presence item with its connection key; frozen. */
export type PresenceSnapshot = Readonly<PresenceItem & { connection: string }>;

export interface ConnectionSnapshot {
  readonly state: ConnectionState;
  /** Why the last connection or attempt ended; null while connected. */
  readonly failure: string | null;
}

/**
 * The replica of conversation `id` at `url`, one per `(url, id)` however many components ask
 * (StrictMode's double mount opens one); closed `grace` ms after the last one unmounts.
 * `options` are read when the replica is made.
 */
export function useReplica(url: string, id: string, options?: ReplicaOptions): Replica;
export function useConversation(replica: Replica | null | undefined): ConversationSnapshot;
export function useDrafts(replica: Replica | null | undefined): readonly DraftSnapshot[];
export function usePresence(replica: Replica | null | undefined): readonly PresenceSnapshot[];
/** One item per person: the sessions of one shared socket (`shared: true`) as one. */
export function usePeople(
  replica: Replica | null | undefined,
): readonly (PresenceSnapshot & { readonly connections: readonly (string | number)[] })[];
export function useApprovals(replica: Replica | null | undefined): readonly ApprovalSnapshot[];
export function useConnection(replica: Replica | null | undefined): ConnectionSnapshot;
