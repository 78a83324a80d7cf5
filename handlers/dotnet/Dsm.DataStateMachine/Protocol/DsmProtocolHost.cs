// The protocol host: a handler class, verified as it is, with one line in a Main.
//
//   static int Main(string[] args) =>
//       DsmProtocolHost.Run(args, clock => new MyHandler(clock));
//
// It speaks docs/protocol.md on stdin/stdout: framing, pipelining, ids, open and close in
// order with everything else, named stores and peers, the mapping of the named exceptions to
// error kinds, instants to the microsecond and the year-9999 limit. The handler sees only
// its own contract: IDataStateMachineHandler, a StateHandlerContext, a clock. Console.Out
// goes to stderr, so nothing the handler prints can be taken for an answer.

using System;
using System.IO;
using System.Text;

namespace Dsm.DataStateMachine.Protocol
{
    public static class DsmProtocolHost
    {
        /// <summary>
        /// The protocol version this host speaks (docs/protocol.md, Versions): open is answered
        /// with it when the harness offers it in <c>protocols</c>.
        /// </summary>
        public const int ProtocolVersion = 2;

        /// <summary>
        /// Serves a handler whose store lives in the process (or is named by its own
        /// configuration): each process the harness starts is one store.
        /// </summary>
        public static int Run(string[] args, Func<IClock, IDataStateMachineHandler> factory, HostOptions options = null)
        {
            if (factory == null) throw new ArgumentNullException("factory");
            return Serve(args, options, (clock, store) => factory(clock), false);
        }

        /// <summary>
        /// Serves a handler of the seed's interface (<see cref="Seed.IDataStateMachineHandler"/>:
        /// acquire answers true or false, the writes carry no token) as it is. The host adapts
        /// it and answers <c>open</c> with <c>"shape": "seed"</c>, so <c>dsm verify</c> judges
        /// it under the seed semantics profile.
        /// </summary>
        public static int Run(string[] args, Func<IClock, Seed.IDataStateMachineHandler> factory, HostOptions options = null)
        {
            if (factory == null) throw new ArgumentNullException("factory");
            return Serve(args, options, (clock, store) => factory(clock), false);
        }

        /// <summary>A handler of the seed's interface that works in a store the harness names.</summary>
        public static int Run(string[] args, Func<IClock, string, Seed.IDataStateMachineHandler> factory, HostOptions options = null)
        {
            if (factory == null) throw new ArgumentNullException("factory");
            return Serve(args, options, (clock, store) => factory(clock, store), true);
        }

        /// <summary>
        /// Serves a handler that can work in a store the harness names on <c>open</c> (a
        /// file, a schema, a key prefix): <paramref name="factory"/> gets the name, or
        /// <c>null</c> when none is named. Every process opened with the same name must reach
        /// the same records; the harness then races its workers through several processes.
        /// </summary>
        public static int Run(string[] args, Func<IClock, string, IDataStateMachineHandler> factory, HostOptions options = null)
        {
            if (factory == null) throw new ArgumentNullException("factory");
            return Serve(args, options, (clock, store) => factory(clock, store), true);
        }

        /// <summary>
        /// Serves whatever the factory builds: an <see cref="IDataStateMachineHandler"/>, or a
        /// handler of the seed's interface, which the host detects and adapts.
        /// </summary>
        public static int RunAny(string[] args, Func<IClock, string, object> factory, bool namedStores, HostOptions options = null)
        {
            if (factory == null) throw new ArgumentNullException("factory");
            return Serve(args, options, factory, namedStores);
        }

        private static int Serve(string[] args, HostOptions options, Func<IClock, string, object> factory, bool namedStores)
        {
            options = options ?? new HostOptions();
            foreach (var arg in args ?? new string[0])
            {
                if (arg == "--serial") options.Concurrent = false;
            }
            // Stdout carries answers only: the host keeps the real stdout for itself, and
            // Console.Out (a stray Console.WriteLine in handler code, a library's progress
            // line) goes to stderr, which the harness keeps and quotes, before any handler
            // code runs. A line of handler chatter on stdout would otherwise be read as a
            // malformed answer and end the run.
            var answers = new AnswerStream(Console.OpenStandardOutput());
            Console.SetOut(Console.Error);
            var session = new HostSession(factory, namedStores, options, answers);
            return Pump(Console.OpenStandardInput(), session, answers);
        }

        /// <summary>
        /// UTF-8 that throws on a byte that is not UTF-8, where <c>Encoding.UTF8</c> puts U+FFFD in
        /// its place: a data_json would then be stored with characters the client never sent.
        /// </summary>
        private static readonly UTF8Encoding StrictUtf8 = new UTF8Encoding(false, true);

        private static void Handle(HostSession session, byte[] bytes, int start, int count)
        {
            string line;
            try
            {
                line = StrictUtf8.GetString(bytes, start, count);
            }
            catch (DecoderFallbackException error)
            {
                session.HandleUndecodable(Encoding.UTF8.GetString(bytes, start, count), error);
                return;
            }
            session.HandleLine(line);
        }

        /// <summary>
        /// Reads whatever the pipe holds, answers every complete line in it, then writes the
        /// answers in one go: a burst of pipelined requests costs one read and one write.
        /// </summary>
        private static int Pump(Stream input, HostSession session, AnswerStream answers)
        {
            var chunk = new byte[1 << 16];
            var partial = new MemoryStream();
            while (!session.Closed)
            {
                int read = input.Read(chunk, 0, chunk.Length);
                if (read <= 0) break;
                answers.BeginBatch();
                try
                {
                    int start = 0;
                    for (int i = 0; i < read && !session.Closed; i++)
                    {
                        if (chunk[i] != (byte)'\n') continue;
                        if (partial.Length == 0)
                        {
                            Handle(session, chunk, start, i - start);
                        }
                        else
                        {
                            partial.Write(chunk, start, i - start);
                            Handle(session, partial.GetBuffer(), 0, (int)partial.Length);
                            partial.SetLength(0);
                        }
                        start = i + 1;
                    }
                    if (!session.Closed && start < read) partial.Write(chunk, start, read - start);
                }
                finally
                {
                    answers.EndBatch();
                }
            }
            if (!session.Closed) session.EndOfInput();
            answers.Flush();
            return 0;
        }
    }
}
